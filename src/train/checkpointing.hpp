// Checkpoints of a training run: resuming from the newest valid one, the observer that saves them,
// and the model hash (the checkpoint's) a run ends with.
//
// Saves are sharded: each rank writes its share of what its tensor-parallel group holds — of its
// slice of the parameters and AdamW moments, its ZeRO shard (or an equal part between the
// data-parallel replicas) — into one data file of its own, with nothing gathered; world rank 0 writes the manifest, which places each
// piece in its global tensor (src/ckpt/checkpoint.hpp), once every file is durable. The state
// records the layout that wrote it. Resuming, every rank reads only what it holds — its slices of the
// parameters and its part of the moments, in whichever layout wrote them (ckpt::CheckpointReader) —
// and the ranks agree on the newest checkpoint all of them could read.
// Asynchronously ([checkpoint] async), the shards are copied to host memory at the end of the step
// and a thread of each rank writes them, the ranks' threads meeting on a duplicate of the world
// group, while training continues.
// Not here: the format (src/ckpt).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/ckpt/checkpoint.hpp"
#include "src/model/param_layout.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"

namespace lockstep {

// The prefixes of a training checkpoint's tensors, in the order it lists them: every parameter
// ("model/NAME"), then its AdamW moments.
inline constexpr const char* kStatePrefixes[] = {ckpt::kModelPrefix, "optim/m/", "optim/v/"};

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
  // be filled after the Checkpointer is made (it is one of them). Collective (with [checkpoint]
  // async, it makes the writer thread's duplicate of the world group).
  Checkpointer(TrainRun& run, const std::vector<StepObserver*>& observers);
  // Waits for a save in flight (its errors are no longer reported).
  ~Checkpointer() override;
  // Saves after every [checkpoint] every steps (with every = "auto", after the first step and then
  // at the interval checkpoint_interval.hpp gives), the last step, and a step a signal stops after.
  // With [checkpoint] async the step's state is copied to host memory and written by a thread
  // while training goes on; a save waits for the one before it to land (saying so), and the run's
  // last checkpoint is whole before end_step returns. Collective.
  void end_step(const StepRecord& r) override;
  // Called on world rank 0 with each checkpoint's directory once it is written ([inject]'s ckpt/ sites).
  void on_saved(std::function<void(const std::string& dir, int64_t step_done)> listener) {
    on_saved_ = std::move(listener);
  }

 private:
  struct Snapshot;  // what a save writes, taken at the end of its step
  struct Written;   // what it wrote, or the error every rank met
  struct InFlight;  // an asynchronous save being written
  Snapshot snapshot(int64_t step_done, float loss, bool copy);
  // Writes the snapshot's shards, and on rank 0 the manifest: collective over `comm`.
  Written write(const Snapshot& s, comm::Communicator& comm) const;
  void report(const Written& w);
  // Waits for the save in flight and reports it; throws its error on every rank.
  void land_in_flight();
  // [checkpoint] every = "auto": whether to save after step `done`, and the interval from rank 0's
  // measured save stall (collective: every rank takes rank 0's).
  bool due_auto(int64_t done) const;
  void update_interval(double stall_s);

  TrainRun& run_;
  const std::vector<StepObserver*>& observers_;
  std::function<void(const std::string&, int64_t)> on_saved_;
  std::unique_ptr<comm::Communicator> writer_comm_;  // the world group's duplicate for the writer thread
  std::vector<float> snapshot_buffer_;               // an asynchronous save's copy of this rank's shards
  std::unique_ptr<InFlight> in_flight_;
  int64_t auto_every_ = 0;  // every = "auto": steps between saves (0: not measured yet)
  int64_t last_saved_ = 0;
  double step_seconds_ = 0;  // the steps' time so far, and how many
  int64_t steps_timed_ = 0;
};

// The model hash of the run's parameters (`lockstep ckpt info`'s), the same on every rank.
// Collective over the world; no rank holds more than its share and (world rank 0) two copies of
// one whole tensor.
std::string model_hash(const TrainRun& run);

// A piece of a rank's tensor-parallel slice that the rank writes in a sharded save — the
// parameters and both AdamW moments alike: the local elements [first, end) of `tensor`.
struct SavedPiece {
  const ParamTensor* tensor;
  int64_t first, end;
  ckpt::ShardPlace place() const;  // where they lie in the global tensor
};

// What the rank at dp rank `dp_rank` of `dp`, tp.rank of tp.size and ep.rank of ep.size writes,
// given its slice `layout` (build_param_layout for its tp rank, its ep rank's experts): of the flat
// slice, its ZeRO shard (zero > 0: make_shard_plan's) or without ZeRO an equal split between the
// replicas; of a tensor several tp or ep ranks hold whole (not split by tp; not a routed expert's),
// its equal part of that. Every rank writes its share; together the ranks of a layout cover every
// element once. A pure function of the layout, for saves and offline conversion alike.
std::vector<SavedPiece> saved_pieces(const std::vector<ParamTensor>& layout, int64_t zero, int64_t dp,
                                     int64_t dp_rank, TpCoord tp, EpCoord ep = {});

}  // namespace lockstep
