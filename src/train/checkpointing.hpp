// Checkpoints of a training run: resuming from the newest valid one, the observer that saves them,
// and the model hash (the checkpoint's) a run ends with.
//
// Saves are sharded: each rank writes its share of what its tensor-parallel group holds — of its
// slice of the parameters and AdamW moments, its ZeRO shard (or an equal part between the
// data-parallel replicas) — into one data file of its own, with nothing gathered; world rank 0 writes the manifest, which places each
// piece in its global tensor (src/ckpt/checkpoint.hpp), once every file is durable. The state
// records the layout that wrote it. Resuming, every rank reads the whole tensors back (any layout
// loads any checkpoint) and keeps its slices and its part of the moments.
// Not here: the format (src/ckpt); asynchronous saves; reading only the byte ranges a rank needs.
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
