// The planner's cost model (docs/planner.md; Planner::predict in planner.hpp computes it, with
// the collectives' times below): one step of a layout on a cluster, predicted from
// the model's layer list, the trainer's own stage assignment and pipeline tables, and α–β models
// of the collectives — or, on the local cluster, from measurements of this machine's passes and
// collectives (compute_profile.hpp, collective_bench.hpp).
//
// Time of the busiest pipeline rank (its stage's layers, src/train/pipeline.hpp's plan_stages):
//   compute    FLOPs of its layers (layer list: 2 per weight per token forward, 4 backward, the
//              attention's scores and values; a tied head's product counted on the head's stage)
//              at the cluster's GEMM rate for the precision, over tp, and the bytes its other
//              kernels move (norms, softmax, activations, residual adds, the loss:
//              kernel_traffic.hpp) at the HBM's streaming rate; recomputation re-runs the
//              recomputed sub-layers' forwards before their backward. Measured: the passes of the
//              rank's shape (tp, sp, cp, micro-batch, recomputation) times its layers' share of the
//              FLOPs, every kernel of them included;
//   tp comm    per micro-batch, one all-reduce of the residual stream's micro-batch (mb·T·C
//              activations) per attention and MLP sub-layer forward and backward, one more for the
//              embedding's output (forward) and the head's input gradient (backward) — sequence
//              parallelism moves the same bytes as an all-gather and a reduce-scatter; not hidden;
//   cp comm    context parallelism (parallel/context_parallel.hpp), per attention layer and
//              micro-batch: the forward all-gathers every position's k and v (mb·T·2·NKV·HS/tp
//              fp32), the backward gathers them again (and once more for a recomputed forward)
//              and reduces their gradients over cp — canonical: exact, as the gradients are; fast:
//              an fp32 all-reduce; not hidden. A rank's tokens are mb·T/cp, so its compute, its tp
//              collectives and its activations are 1/cp of a whole sequence's (the zig-zag blocks
//              give every rank the same share of the causal attention); measured passes are the
//              cp rank's own (its attention against every key, its exact sums of their
//              gradients: compute_profile.hpp). Its gradients are reduced, and ZeRO shards them,
//              over dp × cp;
//   ep comm    expert parallelism: each MoE layer's rows (top_k a token) sent to their experts' ranks
//              and back, forward and backward, as all-to-alls; the busiest rank computes and
//              receives moe_load times a rank's mean share of the routed rows (PlanRequest);
//   pipeline   the schedule's table (pipeline_schedule.hpp) timed by simulate() with each rank's
//              own passes (F, B = Bi + W halved) and a p2p send of a micro-batch's activations: its
//              makespan over the busiest rank's busy time is the bubble, the sends on the critical
//              path and the other stages' share of the fill and drain;
//   dp         the gradient reduction as the trainer does it (data_parallel.hpp), in buckets of
//              [parallel] bucket_mb one after the other: zero 0 and 1 an all-reduce of the fp32
//              gradient (zero 1 then an all-gather of the parameters), zero 2 a reduce-scatter in
//              every micro-batch and the parameters' all-gather; the buckets are reduced during the
//              backward, so what is exposed is the part longer than the backward it overlaps, and
//              at least the last bucket's — all of it where a rank's communication has no core of
//              its own (Cluster::comm_beside_compute); zero 3 instead of the parameters'
//              all-gather one all-gather per layer the passes run (fp32, the matrices in bf16 in
//              a bf16 run, as the trainer gathers them; a forward's every layer but the
//              first, a backward's every layer but the last), gathered ahead while the passes
//              compute: exposed, the part longer than the step's passes and at least the first
//              layer's — all of it, as for the buckets, where communication has no core of its own;
//              each priced by the all-gather whose buffers the caches no longer hold (layer_gather_time);
//   skew       where ranks that compute the same work meet at collectives (dp or cp replicas, tp,
//              ep), each collective waits for the slowest of them: the cluster's measured share
//              of the busiest rank's compute (sync_skew.hpp), whatever the number of collectives,
//              since the ranks' difference grows with the compute between two. Not for a
//              pipeline's sends alone, whose simulation has a stage wait for the other's passes;
//   update     zeroing and rounding the gradients, their norm and AdamW over the rank's parameters
//              (over dp with ZeRO 1 and up): measured, or on a declared cluster their bytes at the
//              streaming rate;
//   state at rest  the [verify] state_at_rest detector, on by default, which the trainer's step
//              includes: it hashes the rank's parameters (over dp with ZeRO 3) and AdamW moments
//              (over dp from ZeRO 1) after the update and again before the next passes. Measured
//              with the passes (for the rank's parameters and moments whole, scaled to what it
//              holds), or on a declared cluster twice those bytes at the streaming rate.
// Canonical mode reduces exactly (parallel/exact_reduce.hpp): the exact sums' doubles
//   reduce-scattered, the rounded fp32 all-gathered — 1.5 times an fp32 all-reduce's bytes, or the
//   exact all-reduce as measured.
// Collectives: rings over the group's link (NVLink when the group lies within a node, the
//   GPU's share of the inter-node network otherwise): all-reduce 2(n−1)·α + 2(n−1)/n·S/β,
//   reduce-scatter and all-gather half of it; a p2p send α + S/β. A measured all-reduce, where
//   the cluster has one for the group's size, is interpolated by size instead.
// Memory of the GPU that holds the most: parameters (fp32, and a bf16 copy of the matrices in
//   bf16 and fp8, two fp8 copies of them in fp8), fp32 gradients (canonical mode: and the exact
//   sums, a double and a flag each, and the exact reduction's buffers for one bucket: every
//   rank's doubles of this rank's shard and their exact sum), AdamW's m and v (zero 1: over dp;
//   zero 2: gradients too, plus the staging of one bucket; zero 3: parameters too, plus two
//   windows of the largest layer's, without a bf16 copy), the activations each micro-batch keeps per layer (the trainer's:
//   the residual stream, norm outputs, QKV, the attention probabilities (mb, NH, T/cp, T), MLP hidden, logits; 2
//   bytes in bf16/fp8, 4 in fp32; sequence parallelism splits the stream over tp; recomputed
//   sub-layers keep their input and one layer's worth is rebuilt at a time) times the micro-batches
//   the schedule keeps in flight on that rank (interleaved: each chunk's own peak, since each chunk
//   keeps its own activation sets), one micro-batch's backward buffers (the layers' shared scratch
//   and the stream's gradients), context parallelism's buffers (one set the attention layers use in
//   turn: fp32 gathers of every position's q, k and v and the keys' gradients; canonical, their
//   exact sums, a double and a flag each, and one exact reduce-scatter's), and the cluster's
//   reserved memory.
// Not modelled: the data loader, overlap of tp collectives with compute, network contention
//   between groups, kernel fusion on a GPU (every op streams its own tensors).
#pragma once

#include <cstdint>
#include <string>

#include "src/model/layer_list.hpp"
#include "src/plan/cluster.hpp"
#include "src/plan/layout.hpp"

namespace lockstep::plan {

inline constexpr double kGiB = 1 << 30;

struct PlanRequest {
  ModelDesc model;  // its seq_len the step's
  int64_t global_batch = 0;  // sequences per step
  Precision precision = Precision::kBf16;
  Mode mode = Mode::kFast;  // canonical: exact reductions (more bytes)
  // [parallel] reduce = "exact": the gradients summed over the replicas exactly and rounded once
  // (canonical mode: the exact sums' doubles; fast mode: the fp32 gradients, added exactly by
  // their owner); "fast": an fp32 reduce-scatter and all-gather.
  bool exact_reduce = true;
  double bucket_bytes = 25.0 * (1 << 20);  // [parallel] bucket_mb: the gradient reduction's bucket
  // The routed rows of the busiest expert-parallel rank over the mean (1: a balanced router); that
  // rank sets the step, computing and receiving this much more than its share.
  double moe_load = 1;
  bool state_at_rest = true;  // [verify] state_at_rest: its hashes in every step (measured passes carry their own)
  std::string source;  // the model's config file, for messages
};

struct StepTime {
  double compute = 0;    // the busiest rank's kernels, recomputation included
  double recompute = 0;  // of which forwards run again
  double streaming = 0;  // of which the kernels other than GEMMs (a declared cluster's HBM traffic)
  double tp_comm = 0;
  double cp_comm = 0;    // context parallelism's gathers of k and v and reductions of their gradients
  double ep_comm = 0;    // expert parallelism's exchanges of the MoE layers' rows
  double pipeline = 0;   // the makespan beyond the busiest rank's passes: bubble and p2p
  double dp_exposed = 0;
  double skew = 0;       // waiting for the slowest rank at the collectives (Cluster::sync_skew)
  double optimizer = 0;  // the AdamW update: measured (the local cluster), or its bytes at the streaming rate
  double state_at_rest = 0;  // the state-at-rest detector's hashes of the rank's parameters and moments
  double total = 0;
};

struct Memory {
  double params = 0, grads = 0, optimizer = 0, activations = 0, reserved = 0;
  double total() const { return params + grads + optimizer + activations + reserved; }
};

struct Prediction {
  Layout layout;
  StepTime time;
  Memory memory;  // of the GPU that holds the most
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs per second over the GPUs' peak in the precision
  // Hardware FLOPs: the model's and the recomputed forwards', over the same peak — what papers
  // that count the recomputation report (Megatron-LM SC'21's formula does).
  double hfu = 0;
  int64_t micro_batches = 0;  // per step, per pipeline
};

// α–β ring collectives of `bytes` (the whole buffer) over n ranks, and a point-to-point send.
double all_reduce_time(double bytes, int64_t n, const Link& l);
// The all-reduce as measured where the measurement covers n ranks (interpolated by size), else α–β.
double all_reduce_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured);
// An all-gather of `bytes` (the gathered buffer) over n ranks: as measured, else a ring all-reduce's
// second half.
double all_gather_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured);
// ZeRO-3's gather of a layer, between passes that evict its buffers from the caches: as measured
// so, else the all-gather (a GPU's collectives read and write HBM either way).
double layer_gather_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured);
// Canonical mode's exact all-reduce of fp32_bytes of values: as measured, else a reduce-scatter of
// the exact sums' doubles and an all-gather of the fp32, 1.5 times an fp32 all-reduce's bytes.
double exact_all_reduce_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured);
// Its reduce-scatter alone (ZeRO-2's: every rank's exact sums added into the owners' running sums),
// split evenly or, where `one_owner`, inside one rank's shard: as measured, else the doubles' two
// thirds of its bytes.
double exact_reduce_scatter_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured,
                                 bool one_owner);
// Fast mode's exact reduce-scatter of fp32 gradients ([parallel] reduce = "exact"): each rank's
// values sent to their owner, which adds them exactly and rounds once; split evenly or inside one
// rank's shard: as measured, else an fp32 reduce-scatter (half the all-reduce).
double exact_fp32_reduce_scatter_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured,
                                      bool one_owner);
double send_time(double bytes, const Link& l);
// An all-to-all(v) in which each of n ranks sends (n−1)/n of its `bytes` to the others, an equal
// part each: (n−1)·α + (n−1)/n·bytes/β.
double all_to_all_time(double bytes, int64_t n, const Link& l);

// The link of a group of n ranks `stride` apart in the mesh's rank order (tp fastest, then cp, ep,
// pp, dp): NVLink if the group fits in a node.
const Link& group_link(const Cluster& c, int64_t stride, int64_t n);

}  // namespace lockstep::plan
