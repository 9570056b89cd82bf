// Rollback ([verify] on_fault = "rollback"): before each step's forward, once the state at rest has
// passed its check, every rank keeps an in-memory copy of what the step changes — its parameters,
// its AdamW moments (its ZeRO shard), the data cursor and the observers' histories. A finding that
// rolls back (every rank meets it together: FaultRollback) restores that copy and the step runs
// again; nothing is skipped, so a transient fault leaves the run bitwise what a clean one is (in
// canonical mode; fast mode too, its order fixed by the thread count). A fault that every replay
// of the step meets again is persistent: after max_replays replays the run stops (exit 8) naming
// the finding's ranks, for a supervisor to exclude that device.
// Not here: the detectors (verify/detect), checkpoints (the state on disk, checkpointing.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/data/sampler.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep {

// to = from, copied by blocks on the run's threads (a snapshot is as fast as the memory).
void copy_state(std::span<const float> from, std::vector<float>& to);

// A copy of what a step changes on this rank: its parameters, AdamW moments, the data cursor and
// the histories of `observers` (their state_key).
class StepState {
 public:
  void take(const TrainRun& run, const std::vector<StepObserver*>& observers);
  // Restores the copy; every observer hears that the state is the one `step` began or ended on
  // (rolled_back).
  void put_back(TrainRun& run, const std::vector<StepObserver*>& observers, int64_t step) const;

 private:
  std::vector<float> params_, m_, v_;
  data::SamplerState sampler_;
  nlohmann::json histories_;
};

class StepSnapshots final : public StepObserver {
 public:
  // observers: the run's, whose histories (state_key) are part of the snapshot and which hear of a
  // rollback (rolled_back).
  StepSnapshots(TrainRun& run, const std::vector<StepObserver*>& observers, int max_replays)
      : run_(run), observers_(observers), max_replays_(max_replays) {}

  void begin_step(int64_t step) override;  // copies the state (attach after the state-at-rest check)

  // After `rollback` met the run in the step the last snapshot began: restores the snapshot and
  // returns the step to run again; throws FaultStop (kExitPersistent) when the step has been
  // replayed max_replays times already. Every rank calls it together.
  int64_t restore(const detect::FaultRollback& rollback);
  int64_t rollbacks() const { return rollbacks_; }
  // The step of the last snapshot, and whether a rollback to it now would stop the run instead.
  int64_t step() const { return step_; }
  bool replays_spent() const { return replays_ >= max_replays_; }
  // Restores the last snapshot for a replay (replay.hpp, buddy_replay.hpp), counting nothing and
  // saying nothing.
  void put_back();
  const std::vector<StepObserver*>& observers() const { return observers_; }

 private:
  TrainRun& run_;
  const std::vector<StepObserver*>& observers_;
  int max_replays_;
  int64_t step_ = -1;  // the step the snapshot begins (-1: none yet)
  StepState before_;
  int replays_ = 0;  // of step_
  int64_t rollbacks_ = 0;
};

}  // namespace lockstep
