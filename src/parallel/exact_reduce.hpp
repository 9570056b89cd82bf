// Reproducible reductions across ranks: exact sums that are rounded once, so the result does not
// depend on the number of ranks, their order, or the MPI algorithm (docs/numerics.md, "The canonical contract"; "Reproducible
// reduction").
//
// Error bound: none beyond the one final rounding to fp32 (round-to-nearest-even of the exact
// sum of every rank's exact local sum) — the same bits a single process computes with
// ExactAccumulator / ChunkCombiner over all the partials.
//
// Gradient reduce-scatter (exact_reduce_scatter):
//   1. an all-to-all(v) sends every rank each element of its shard as the sender's exact local sum
//      held in a double (ExactAccumulator::partial_sums(), sent in place: 8 bytes per element);
//   2. the rare element whose local sum spilled to a SuperAccumulator (its double is then stale)
//      goes as well as a record of 14 int64 (shard-local index, flags, 12 digits: 112 bytes), after
//      an all-to-all of the record counts — each count three times, read as the copies' bitwise
//      majority (src/core/majority.hpp): the counts size the next message, so a corrupted count
//      must neither hang nor overrun it; a record outside the shard is refused;
//   3. the owner drops the stale doubles of spilled elements, adds every received double and
//      SuperAccumulator into a fresh ExactAccumulator — exact, so in any order — and rounds once.
//   Non-finite local sums travel as they are (±inf and NaN in the double or the flags).
//   Bytes sent per rank: 8·N·(p−1)/p + 112·(spilled elements) + 24·(p−1), against 4·N·(p−1)/p for a
//   float reduce-scatter (MPI_Reduce_scatter on fp32, not reproducible). A following fp32 all-gather
//   (4·N·(p−1)/p) makes it an exact all-reduce: 12·N·(p−1)/p, 1.5x a ring all-reduce of fp32.
//
// Scalar combination (combine_exact): a ChunkCombiner (loss sum, gradient sum of squares) is sent
// as a float expansion (peeled with finish()/add(); at most kCombinerTerms floats, since each term
// takes at least 24 bits off a value spanning at most 2^159 .. 2^-149); every rank
// all-gathers them and sums them in a SuperAccumulator, so every rank gets the same bits, equal to
// one process's combiner over all the partials.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/exact_sum.hpp"
#include "src/model/model.hpp"

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
  // The shards' parts inside [first, end), counted from `first` (a gradient bucket's share of the
  // global reduce-scatter; shards outside the window are empty).
  ShardPlan window(int64_t first, int64_t end) const;
};

// The first valid cut at or after x: the first chunk start at or after x inside the tensor holding
// x, else that tensor's end; the buffer's end for x past it.
int64_t first_valid_cut(const std::vector<ParamTensor>& layout, int64_t x);

// Near-equal shards: cut r is the first valid cut at or after r·N/parts.
ShardPlan make_shard_plan(const std::vector<ParamTensor>& layout, int parts);

// Exact reduce-scatter of per-element exact sums: out (plan.size(rank) floats) receives the
// rounded exact sum over the group of elements offset + [plan.first(rank), plan.end(rank)) of
// `local` (offset: where a window's plan starts in the accumulator). Collective over `comm`. It
// reads only those elements: other threads may add to other elements meanwhile (the gradient
// buckets of data_parallel.hpp), never to these.
void exact_reduce_scatter(const ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                          float* out, int64_t offset = 0);
// The same, but the exact sums are added to elements sum_offset + [0, plan.size(rank)) of `sum`
// instead of being rounded (ZeRO-2 accumulates a shard over micro-batches and rounds once).
void exact_reduce_scatter_add(const ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                              ExactAccumulator& sum, int64_t sum_offset, int64_t offset = 0);
// The same for ranks whose local sums are fp32 values (fast-mode gradients): one term each.
void exact_reduce_scatter(const float* local, const ShardPlan& plan, comm::Communicator& comm, float* out);

// The exact sum over the group of every rank's combiner, rounded once to fp32 (same on all ranks);
// with `outers`, over every rank of the groups they join (each group's ranks' terms gathered over
// the next: expert-parallel ranks, then pipeline stages; nullptr entries skipped). Collective over
// comm, then each outer in turn.
float combine_exact(const ChunkCombiner& local, comm::Communicator& comm,
                    std::initializer_list<comm::Communicator*> outers = {});

// Floats whose exact sum is the combiner's exact value (kCombinerTerms of them, zero-padded). A
// non-finite value (or one beyond FLT_MAX) is sent as its fp32 rounding (±inf, NaN).
inline constexpr int kCombinerTerms = 16;
void combiner_terms(ChunkCombiner c, float* terms);

}  // namespace lockstep::parallel
