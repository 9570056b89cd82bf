// Reproducible reductions across ranks: exact sums that are rounded once, so the result does not
// depend on the number of ranks, their order, or the MPI algorithm (NUMERICS.md "Reproducible
// reduction").
//
// Error bound: none beyond the one final rounding to fp32 (round-to-nearest-even of the exact
// sum of every rank's exact local sum) — the same bits a single process computes with
// ExactAccumulator / ChunkCombiner over all the partials.
//
// Gradient reduce-scatter (exact_reduce_scatter):
//   1. each rank turns its local exact sum of every element into a float expansion, t1 + t2 + t3
//      (= the exact value; t1 = RN(s), t2 = RN(s - t1), t3 = s - t1 - t2, all fp32). A local sum
//      held as a double (ExactAccumulator's fast path, 53 bits) always fits three floats; the rare
//      element that needs more (a SuperAccumulator spill) sends the rest as (index, float) extras.
//      ExactAccumulator exposes only round()/add(), so the expansion is peeled with those: the
//      local accumulator is consumed (left at zero).
//   2. an all-to-all sends every rank the three terms of the elements of its shard (12 bytes per
//      element) and the extras (an all-to-all of counts, then an all-to-allv of 8-byte entries);
//   3. the owner adds every received term into a fresh ExactAccumulator — exact, so in any order
//      — and rounds once.
//   Bytes sent per rank: 12·N·(p−1)/p + 8·(extras), against 4·N·(p−1)/p for a float reduce-scatter
//   (MPI_Reduce_scatter on fp32, not reproducible). A following fp32 all-gather (4·N·(p−1)/p) makes
//   it an exact all-reduce: 16·N·(p−1)/p, twice a ring all-reduce of fp32.
//   Limitation: a rank whose *local* exact sum of an element exceeds FLT_MAX sends ±inf for it
//   (an fp32 gradient that large is already lost).
//
// Scalar combination (combine_exact): a ChunkCombiner (loss sum, gradient sum of squares) is sent
// as the same kind of float expansion (peeled with finish()/add(); at most kCombinerTerms floats,
// since each term takes at least 24 bits off a value spanning at most 2^159 .. 2^-149); every rank
// all-gathers them and sums them in a SuperAccumulator, so every rank gets the same bits, equal to
// one process's combiner over all the partials.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/exact_sum.hpp"
#include "src/model/gpt.hpp"

namespace lockstep::parallel {

// How the flat parameter buffer [0, N) is cut into one contiguous shard per rank. Every cut lies
// on a canonical chunk start of the tensor it falls in (a multiple of kCanonicalChunk = 64
// elements from that tensor's first element) or between tensors, so that every chunk of the
// canonical gradient norm lies in one shard. (A cut at a multiple of 64 of the *flat* buffer would
// split chunks whenever a tensor's offset is not a multiple of 64.)
struct ShardPlan {
  std::vector<int64_t> begin;  // parts + 1 entries: shard r is [begin[r], begin[r + 1])

  int parts() const { return static_cast<int>(begin.size()) - 1; }
  int64_t first(int r) const { return begin[static_cast<size_t>(r)]; }
  int64_t end(int r) const { return begin[static_cast<size_t>(r) + 1]; }
  int64_t size(int r) const { return end(r) - first(r); }
  std::vector<int64_t> sizes() const;
  std::vector<int64_t> firsts() const;
};

// Near-equal shards: cut r is the first valid cut at or after r·N/parts.
ShardPlan make_shard_plan(const std::vector<ParamTensor>& layout, int parts);

// Exact reduce-scatter of per-element exact sums: out (plan.size(rank) floats) receives the
// rounded exact sum over the group of elements [plan.first(rank), plan.end(rank)). `local` is
// consumed (left zero). Collective over `comm`.
void exact_reduce_scatter(ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                          float* out);
// The same for ranks whose local sums are fp32 values (fast-mode gradients): one term each.
void exact_reduce_scatter(const float* local, const ShardPlan& plan, comm::Communicator& comm, float* out);

// The exact sum over the group of every rank's combiner, rounded once to fp32 (same on all ranks).
float combine_exact(const ChunkCombiner& local, comm::Communicator& comm);

// Floats whose exact sum is the combiner's exact value (kCombinerTerms of them, zero-padded). A
// non-finite value (or one beyond FLT_MAX) is sent as its fp32 rounding (±inf, NaN).
inline constexpr int kCombinerTerms = 16;
void combiner_terms(ChunkCombiner c, float* terms);

}  // namespace lockstep::parallel
