// One tensor-parallel rank on its own, for timing its share of the work (compute_profile.hpp): the
// group reports `size` ranks, so the plan gives this rank its shards, and each reduction does this
// rank's local part of the work — the rounding of its exact sums, the copies of a gather — without
// the others' contributions. The values it gives are not the group's (one rank's partial sums
// stand for the total); what it keeps is the cost of a rank's passes apart from the transfers,
// which the planner's collective model adds.
#pragma once

#include <algorithm>
#include <cstdint>

#include "src/parallel/tp_group.hpp"

namespace lockstep::plan {

class SoloTpGroup final : public parallel::TpGroup {
 public:
  explicit SoloTpGroup(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  int64_t rank() const override { return 0; }
  void all_reduce_exact(const ExactAccumulator& acc, float* x) override { acc.round_to(x); }
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_max(float*, int64_t) override {}
  void all_gather(const float* local, float* full, int64_t n) override {
    for (int64_t r = 0; r < size_; ++r) std::copy(local, local + n, full + r * n);
  }
  void reduce_scatter_exact(const ExactAccumulator& acc, float* local) override {
    acc.round_to(0, acc.size() / static_cast<size_t>(size_), local);
  }
  void reduce_scatter_sum(const float* full, float* local, int64_t n) override { std::copy(full, full + n, local); }

 private:
  int64_t size_;
};

}  // namespace lockstep::plan
