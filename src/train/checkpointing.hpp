// Checkpoints of a training run: resuming from the newest valid one, the observer that saves them,
// and the model hash (the checkpoint's) a run ends with.
//
// Checkpoints hold whole tensors (the tp = 1 layout) and whole AdamW moments: ZeRO's shards are
// gathered over dp and tensor parallelism's over tp, and world rank 0 writes them, so a checkpoint
// does not depend on the layout that wrote it (the state records that layout and where each tp
// shard lay). Resuming, every rank reads it and keeps its shards and its part of the moments.
// Not here: the format (src/ckpt), the sharded save of the checkpoint issue.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"

namespace lockstep {

// What resume() found: the step to continue from (0: nothing loaded) and the observers' state.
struct Resumed {
  int64_t step = 0;
  nlohmann::json observers = nlohmann::json::object();  // state_key -> state
};

// Loads the newest valid checkpoint under [checkpoint] dir into the run (parameters, moments,
// sampler). ConfigError when it was written by a run whose trajectory differs ([model],
// batch_size, mode, seed).
Resumed resume(TrainRun& run);

// Gives each observer with a state key its state from `saved` (those the checkpoint has).
void restore_observers(std::span<StepObserver* const> observers, const nlohmann::json& saved);

class Checkpointer final : public StepObserver {
 public:
  // observers: the run's, whose state the checkpoints keep (StepObserver::state_key); the list may
  // be filled after the Checkpointer is made (it is one of them).
  Checkpointer(TrainRun& run, const std::vector<StepObserver*>& observers) : run_(run), observers_(observers) {}
  // Saves after every [checkpoint] every steps, the last step, and a step a signal stops after.
  // Collective.
  void end_step(const StepRecord& r) override;
  // Called on world rank 0 with each checkpoint's directory once it is written ([inject]'s ckpt/ sites).
  void on_saved(std::function<void(const std::string& dir, int64_t step_done)> listener) {
    on_saved_ = std::move(listener);
  }

 private:
  void save(int64_t step_done, float loss);
  TrainRun& run_;
  const std::vector<StepObserver*>& observers_;
  std::function<void(const std::string&, int64_t)> on_saved_;
};

// The model hash of the run's parameters (`lockstep ckpt info`'s). Collective over tp.
std::string model_hash(const TrainRun& run);

}  // namespace lockstep
