// Replay ([verify] replay_every = N): every N-th step runs a second time from its in-memory snapshot
// (rollback.hpp) and each rank compares the state it ends on — its parameters and AdamW moments —
// by their block hash. Canonical mode (and fast mode, whose order the thread count fixes) computes
// the same bits twice, so a difference is a fault in something no checksum covers: activations and
// gradients between ops, non-GEMM ops. A third run classifies it: agreeing with the replay, the
// original was hit by a transient fault and the run goes on from the third run's state (the correct
// one); agreeing with the original, the replay was hit; agreeing with neither, the step does not
// reproduce at all (class persistent: exit 8 unless on_fault = "warn"). The ranks decide together
// (agreed.hpp); under data parallelism a fault on one rank reaches every rank's state through the
// reduction, so the finding names the ranks whose state differs, which need not be the faulty one.
// A fault that reproduces bitwise in every run (a broken unit) is invisible to a replay on the
// same rank. Cost: one more step every N steps.
// Not here: the snapshot (rollback.hpp), the detectors of single products and messages (verify/detect).
#pragma once

#include <cstdint>
#include <functional>

#include "src/comm/communicator.hpp"
#include "src/train/rollback.hpp"
#include "src/train/run.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep {

// The block hash of this rank's parameters and AdamW moments (its ZeRO shard): what a step changes.
uint64_t state_hash(const TrainRun& run);

class StepReplay {
 public:
  StepReplay(TrainRun& run, StepSnapshots& snapshots, detect::FindingLog& log, detect::FaultAction action,
             int64_t every)
      : run_(run), snapshots_(snapshots), log_(log), action_(action), every_(every) {}

  bool due(int64_t step) const { return every_ > 0 && (step + 1) % every_ == 0; }
  // After `step` ran: puts the snapshot back and runs it again with run_again (the step alone,
  // without the observers that report or keep anything), compares, and on a difference runs it a
  // third time and reports the finding. Every rank calls it together.
  void check(int64_t step, const std::function<void()>& run_again);
  int64_t replays() const { return replays_; }

 private:
  TrainRun& run_;
  StepSnapshots& snapshots_;
  detect::FindingLog& log_;
  detect::FaultAction action_;
  int64_t every_;
  int64_t replays_ = 0;
};

}  // namespace lockstep
