// The training loop's observers: everything a step does besides computing it — fault injection,
// dumps, replica checks, progress and metrics, evaluation, checkpoints, and the detectors to come —
// is an observer called at fixed points of every step, in the order the trainer lists them.
// Not here: the loop (trainer.cpp), the observers themselves (observers.hpp, inject.hpp,
// checkpointing.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/parallel/grad_buckets.hpp"

namespace lockstep {

// What a step did.
struct StepRecord {
  int64_t step = 0;           // 0-based
  float loss = 0, lr = 0, grad_norm = 0;  // loss and grad_norm: the worst of any rank's
  // The ranks whose own loss or gradient norm was not finite where some rank's was (empty: every
  // rank's alike).
  std::vector<int> nonfinite_ranks{};
  double seconds = 0;         // the step, from the batch to the update
  double wait_seconds = 0;    // of which this rank waited in collectives (comm::thread_wait_seconds)
  uint64_t comm_bytes = 0;    // sent by this rank in the step (dp and tp groups)
  parallel::OverlapStats overlap;
  parallel::OverlapStats gathers;  // ZeRO-3's parameter gathers (count, time, the passes' wait)
  // Pipeline parallelism: seconds this rank's passes computed, of the seconds they took (the rest
  // waited for a neighbour: the bubble). 0 without.
  double stage_compute_s = 0, stage_s = 0;
  bool last = false;          // the run's last step ([train] steps, or stop_after)
  bool stopping = false;      // a signal stops the run after it (every rank agrees)

  int64_t done() const { return step + 1; }
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before the step's forward.
  virtual void begin_step(int64_t step) {}
  // After the gradient reduction, before clipping; loss is the step's mean loss.
  virtual void after_reduce(int64_t step, float loss) {}
  // After the optimizer's update.
  virtual void after_update(int64_t step) {}
  // The step is done. Collective observers are called on every rank.
  virtual void end_step(const StepRecord& r) {}

  // The run's state was restored to the start of `step` (a rollback, src/train/rollback.hpp),
  // which runs again next: what an observer compares across steps no longer holds.
  virtual void rolled_back(int64_t step) {}

  // State an observer carries from step to step (a detector's history) is kept in checkpoints
  // under this key, so that a resumed run continues with it; "" (the default): none.
  virtual std::string state_key() const { return {}; }
  virtual nlohmann::json save_state() const { return nullptr; }
  virtual void restore_state(const nlohmann::json& state) {}
};

}  // namespace lockstep
