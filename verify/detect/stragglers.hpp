// Slow ranks (stragglers): in a synchronous job every rank waits for the slowest, so a rank whose
// device is throttled or whose host is busy slows the whole job while every step still succeeds.
// Each rank's compute time per step — the step less what its collectives kept it waiting
// (StepRecord::wait_seconds) — is summed over a window of steps and gathered over the world (one
// double per rank per window); a rank whose compute time exceeds the median rank's by the threshold
// in `patience` windows in a row is a finding naming it, with its time, the median's and the
// window. The anchor is Megatron-Core's straggler detector, which compares ranks' GEMM throughput.
// Every rank judges the same gathered figures, so all reach the same finding.
// With the action "stop" the finding asks the run to stop (stop_requested(), the same on every
// rank): the trainer saves a checkpoint after the next step and ends with kExitSlowRank — the
// state is sound, only slow — for `lockstep launch --spares` to restart without the rank.
// Not here: what is done about the rank (`lockstep launch`, a scheduler).
#pragma once

#include <cstdint>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

struct StragglerRule {
  int64_t window = 20;     // steps a comparison covers
  double threshold = 1.25; // compute time over the median's that makes a rank slow
  int64_t patience = 3;    // windows in a row before a finding
};

class StragglerDetector final : public StepObserver {
 public:
  StragglerDetector(StragglerRule rule, comm::Communicator& world, FindingLog& log, FaultAction action);
  void end_step(const StepRecord& r) override;
  void rolled_back(int64_t step) override;
  bool stop_requested() const { return stop_requested_; }

 private:
  StragglerRule rule_;
  comm::Communicator& world_;
  FindingLog& log_;
  FaultAction action_;
  double compute_ = 0;      // this rank's compute seconds in the window so far
  int64_t steps_ = 0;       // steps in the window so far
  int64_t first_step_ = 0;  // the window's first step done
  std::vector<int64_t> slow_windows_;  // per world rank: windows in a row over the threshold
  bool stop_requested_ = false;
};

}  // namespace lockstep::detect
