// Buddy replay ([verify] buddy_every = N): every N-th step, each dp group computes the batch of the
// group before it as well, and each rank compares what it computed with what the batch's own rank
// computed, tensor by tensor (verify/detect/buddy.hpp says how the comparison names the faulty
// rank). What a replay on the same rank cannot see — a fault that every run meets again, a broken
// unit — shows here as a disagreement between two ranks, pinned to the one that disagrees with its
// buddy (with dp = 2: to the pair, there being no third replica), and ends the run with exit 8 for
// a supervisor to exclude that device. A fault that hit the step once is corrected as a replay's
// is (the state becomes that of a third run that agrees with the buddy).
//
// The steps: the step's own run, with the model's tensors hashed as they pass its hook (the
// witness); the state it ends on is kept; the step again from its snapshot with the batches
// rotated by one dp group (its state is thrown away: under a reduction whose order depends on
// the rank, reduce = "fast", it need not be the same); only when some batch disagrees, the step a
// third time in its own assignment. A fault that another detector found and every rollback met
// again is run through the same check before the run stops (pin), so that it too is pinned to
// its rank where the witness sees it. Cost: one more step, a copy of the state and the hashing of
// the activations, every N steps; the witnesses (one hash a tensor) gathered over the world.
// Not here: the snapshot (rollback.hpp), a replay on the same rank (replay.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/train/rollback.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/buddy.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep {

class BuddyReplay final : public StepObserver {
 public:
  // witness: the one the model's hook feeds. Needs dp >= 2 (the config refuses less).
  BuddyReplay(TrainRun& run, StepSnapshots& snapshots, detect::TensorWitness& witness, detect::FindingLog& log,
              detect::FaultAction action, int64_t every)
      : run_(run), snapshots_(snapshots), witness_(witness), log_(log), action_(action), every_(every) {}

  bool due(int64_t step) const { return every_ > 0 && (step + 1) % every_ == 0; }
  // The step's own run is witnessed on a due step, its forward and backward.
  void begin_step(int64_t step) override;
  void after_reduce(int64_t step, float loss) override;

  // After a due step's own run: runs it again with run_again(batch_group, keep_record) — the step
  // alone, this rank computing dp group batch_group's part of the batch; keep_record: its record
  // is the step's — compares, and reports. Every rank calls it together.
  void check(int64_t step, const std::function<void(int64_t batch_group, bool keep_record)>& run_again);
  // Before a rollback's fault is declared persistent (another detector's, which names the ranks
  // it sees, not the faulty one): runs the snapshot's step witnessed and checks it as above, so a
  // fault the witness sees is pinned to its rank (and stops the run there); returns if it sees none.
  void pin(int64_t step, const std::function<void(int64_t batch_group, bool keep_record)>& run_again);
  int64_t runs() const { return runs_; }

 private:
  // Every rank's witness of one run, each as long as the longest (padded with zeros).
  std::vector<std::vector<uint64_t>> gather(std::vector<uint64_t> mine) const;

  TrainRun& run_;
  StepSnapshots& snapshots_;
  detect::TensorWitness& witness_;
  detect::FindingLog& log_;
  detect::FaultAction action_;
  int64_t every_;
  std::vector<uint64_t> own_;  // the step's own run's witness
  StepState after_;            // the state the step's own run ended on
  int64_t runs_ = 0;
};

}  // namespace lockstep
