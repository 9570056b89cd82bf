// Replica hashes ([verify] replicas): after every step, what must be equal across ranks is hashed
// (checksum.hpp; the replicated tensors, small, with plain xxh64) and compared —
//   - data-parallel replicas: every rank's whole parameter buffer, equal across the ranks of its
//     replica group (`dp`: the dp ranks, or dp x cp, that hold the same shards);
//   - under tensor parallelism, the tensors every tp rank holds whole (norms, row-parallel biases,
//     learned positions), equal across the tp ranks of one dp replica.
// One all-gather over the world of (both hashes, the replica group), 24 bytes per rank sent three
// times and read by majority (agreed.hpp), so that every rank judges every group and all reach the
// same finding even when that message is corrupted. In each group the reference hash is
// the most common one (the lowest rank's on a tie); the ranks that differ are named. Class
// "corruption": a replica that differs is silent data corruption or a bug, never noise.
// The parameters' hash is the one the state-at-rest check took after the update, where that
// detector runs (the same bytes: hashing them twice would double the cost); a change to them after
// the update is then the state-at-rest check's to find, before the next step.
// Not here: what corrupts them (src/train/inject.hpp plants such faults for tests).
#pragma once

#include <cstdint>

#include "src/comm/communicator.hpp"
#include "src/model/model.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"
#include "verify/detect/state_at_rest.hpp"

namespace lockstep::detect {

class ReplicaDetector final : public StepObserver {
 public:
  // at_rest: the run's state-at-rest check, whose parameter hash it takes (nullptr: none).
  // Collective over dp (the replica group's lowest world rank names it).
  ReplicaDetector(const Model& model, comm::Communicator& world, comm::Communicator& dp, comm::Communicator& tp,
                  FindingLog& log, FaultAction action, const StateAtRestDetector* at_rest);
  void end_step(const StepRecord& r) override;

 private:
  const Model& model_;
  comm::Communicator& world_;
  comm::Communicator& dp_;
  comm::Communicator& tp_;
  FindingLog& log_;
  FaultAction action_;
  const StateAtRestDetector* at_rest_;
  uint64_t replica_group_;  // the lowest world rank of this rank's dp group
};

}  // namespace lockstep::detect
