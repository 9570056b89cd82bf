// The reductions the tensor-parallel plan's ops (tp_plan.hpp) need across the ranks that share one
// replica's shards: no transport, only what each reduction must give. Implemented over a
// Communicator in tensor_parallel.hpp (and between threads in the tests).
#pragma once

#include <cstdint>

#include "src/core/exact_sum.hpp"

namespace lockstep::parallel {

class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  // x[i] = the exact sum over the group of every rank's exact sum acc[i], rounded once to fp32 (for
  // i < acc.size()): the same bits on every rank, and those one device gets from all the partials.
  virtual void all_reduce_exact(const ExactAccumulator& acc, float* x) = 0;
  // x[i] = fp32 sum over the group, in an order of the backend's choosing but the same bits on
  // every rank. Exact where at most one rank holds a value other than -0.0f.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  // x[i] = maximum over the group (exact).
  virtual void all_reduce_max(float* x, int64_t n) = 0;

  // Sequence parallelism: a (size()·n)-element tensor cut into size() contiguous blocks of n,
  // block r on rank r.
  // full = the concatenation of every rank's `local` block, in rank order.
  virtual void all_gather(const float* local, float* full, int64_t n) = 0;
  // local = block rank() of the exact sums of acc (size()·n elements), rounded once as in
  // all_reduce_exact.
  virtual void reduce_scatter_exact(const ExactAccumulator& acc, float* local) = 0;
  // local = block rank() of the fp32 sum over the group of `full`; exact where at most one rank
  // holds a value other than -0.0f.
  virtual void reduce_scatter_sum(const float* full, float* local, int64_t n) = 0;
};

}  // namespace lockstep::parallel
