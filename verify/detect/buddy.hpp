// Buddy replay's evidence and verdict (src/train/buddy_replay.hpp runs the steps): a rank's batch is
// computed again by its buddy — the rank one place further along dp, with the same tp coordinate —
// and the two computations are compared tensor by tensor. Canonical results (and fast mode's, at one
// thread count) do not depend on which rank computes them, so any difference is a fault, and which
// rank it lies on follows from who disagrees with whom:
//
//   A  the step as it ran: dp group d computes batch d             (every rank's witness)
//   B  the step again, rotated: dp group d computes batch d - 1    (the buddies' witnesses)
//   C  the step once more as it ran (only when A and B disagree, or the reduction's order depends
//      on which rank holds which batch)
//
// Batch d disagrees when A on group d differs from B on group d + 1. Then, per such batch:
//   C equals B, not A   group d's original run was hit once (transient; C's state is the right one);
//   C equals A          the two groups disagree reproducibly: a persistent fault on one of them. A
//                       group faulty in every run spoils both its own batch (in A and C) and the batch
//                       it computes as a buddy (in B), so the group whose batch and buddy batch both
//                       disagree is the faulty one — with dp ≥ 3 it is the only one; with dp = 2 both
//                       groups meet that test and the verdict names the pair (a third replica would
//                       decide, and there is none). A batch that disagrees alone, its owner agreeing
//                       with itself, was computed wrongly by its buddy once: transient, harmless;
//   C equals neither    the step does not reproduce on group d: persistent.
// Within a group, the fault reaches the other tp ranks only through a later collective, so the ranks
// whose witnesses differ first (the smallest tensor index) are the ones named.
// A witness is the block hash of each tensor the model shows its hook (activations and their
// gradients, micro-batch by micro-batch); the parameter gradients and the update are covered by the
// state hashes the caller compares (buddy_replay.cpp), the products by ABFT.
// Not here: running the steps, reporting (buddy_replay.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor_view.hpp"

namespace lockstep::detect {

// The hashes of the tensors a model shows its hook between start() and stop(), in order.
class TensorWitness {
 public:
  void start();
  // The model's hook calls it with every tensor; it records only while collecting.
  void observe(std::string_view name, const TensorView& t);
  // Stops collecting; returns the hashes (names(i) says whose).
  std::vector<uint64_t> stop();
  bool collecting() const { return collecting_; }
  size_t size() const { return names_.size(); }
  const std::string& name(size_t i) const;

 private:
  bool collecting_ = false;
  std::vector<uint64_t> hashes_;
  std::vector<std::string> names_;
};

// The witnesses of runs A, B and C (C empty: not run), one per world rank in world rank order
// (world rank = dp index · tp + tp index).
struct BuddyRuns {
  int64_t dp = 0, tp = 0;
  std::vector<std::vector<uint64_t>> original, buddy, third;
};

// The dp groups whose batch A and B computed differently (in increasing order).
std::vector<int64_t> disagreeing_batches(const BuddyRuns& runs);

struct BuddyVerdict {
  enum class Kind {
    kAgree,           // no batch disagrees
    kBuddyHit,        // B was wrong once: A (and C) hold the right state
    kOriginalHit,     // A was wrong once: C holds the right state
    kPersistent,      // a fault every run meets, or a step that does not reproduce
  };
  Kind kind = Kind::kAgree;
  std::vector<int> ranks;  // world ranks named (for kPersistent with pinned = false: the candidates)
  bool pinned = true;      // ranks are the faulty ones, not a set that holds them
  size_t tensor = 0;       // index (in the witness) of the first tensor that differs
  std::string detail;      // the evidence in words
};

// The verdict on runs with C present (or none needed: every batch agrees).
BuddyVerdict judge_buddies(const BuddyRuns& runs);

}  // namespace lockstep::detect
