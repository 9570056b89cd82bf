// `lockstep bench --collectives` (under mpirun): the communicator's all-reduce timed over message
// sizes, as nccl-tests' all_reduce_perf times NCCL's, and fitted to the ring model the planner
// predicts with (cost_model.hpp): t = 2(n−1)·α + 2(n−1)/n · S/β; the all-gather of the ZeRO
// parameters' and context parallelism's gathers; and canonical mode's exact
// all-reduce (the tensor-parallel one, TpGroup::all_reduce_exact) and its reduce-scatter alone
// into running exact sums (ZeRO-2's, exact_reduce_scatter_add: split evenly, and owned by one
// rank), and fast mode's exact reduce-scatter of fp32 values the same two ways, over the same
// sizes, whose exact additions cost compute as well as bytes; and the all-gather again as ZeRO-3's
// layer gathers meet it, its buffers evicted from the caches by the passes between two. Every size runs
// `repeats` times after one untimed run; a run's time is the slowest rank's (the collective ends
// for the job when it ends there), and the median is kept. Beside them, the ranks' skew at a
// synchronisation (sync_skew.hpp), over `repeats` rounds and at least 7.
// The local cluster of `lockstep plan --cluster local` is built from these figures.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm/communicator.hpp"
#include "src/plan/cluster.hpp"
#include "src/plan/sync_skew.hpp"

namespace lockstep::plan {

struct CollectiveBench {
  int64_t ranks = 0;
  std::vector<CollectiveSample> all_reduce;        // fp32 sums
  std::vector<CollectiveSample> all_gather;        // of fp32 (bytes: the gathered buffer's)
  std::vector<CollectiveSample> layer_gather;      // the same from and into buffers out of the caches
  std::vector<CollectiveSample> exact_all_reduce;  // canonical mode's (bytes: its fp32 values')
  // Its first half, as ZeRO-2 runs it (bytes: the same): split evenly over the ranks, and inside one
  // rank's shard (a bucket smaller than a shard).
  std::vector<CollectiveSample> exact_reduce_scatter, exact_reduce_scatter_owned;
  // Fast mode's exact reduce-scatter of fp32 values ([parallel] reduce = "exact"), the same two ways.
  std::vector<CollectiveSample> exact_fp32_reduce_scatter, exact_fp32_reduce_scatter_owned;
  Link fit;                   // α and β of the ring model, least squares over the samples
  SyncSkew skew;
  nlohmann::json to_json() const;
};

// The largest size timed: 16 MiB.
inline constexpr int64_t kMaxCollectiveFloats = int64_t{1} << 22;
// What a rank rewrites before each layer gather to push its buffers out of the caches: beyond a
// core's L2 and its share of the last level on the CPUs these machines have (the sizes a VM
// reports for its caches are not the host's, so none is read).
inline constexpr size_t kEvictionBytes = size_t{64} << 20;

// Collective over `world` (every rank returns the same figures); nothing to time in a world of one.
// `backend` computes the skew's segments (one thread, as a rank of the local cluster).
// Sizes from 4 KiB by factors of 4 up to the first that holds `largest_bytes` (16 KiB at least,
// 16 MiB at most): the cost model prices larger messages from the fit beyond the largest sample.
CollectiveBench bench_collectives(comm::Communicator& world, Backend& backend, int64_t repeats,
                                  double largest_bytes = 4.0 * kMaxCollectiveFloats);

CollectiveBench collective_bench_from_json(const nlohmann::json& j, const std::string& where);

// α and β of t = 2(n−1)α + 2(n−1)/n · S/β by least squares over the samples (at least two sizes);
// a negative intercept or slope (noise on a fast link) is clamped to a tiny positive one.
Link fit_ring_all_reduce(const std::vector<CollectiveSample>& samples, int64_t n);

}  // namespace lockstep::plan
