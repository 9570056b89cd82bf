// Data parallelism with ZeRO-0/1/2/3 over one dp group: gradient reduction (exact or fast), the
// global gradient norm, AdamW (replicated or on this rank's shard) and the parameter all-gather.
//
// Every rank runs the single-device model on its own part of the global batch (plan_dp_batch),
// then:
//   backward            the gradient buffer is cut into buckets of about DpOptions::bucket_bytes
//                       (grad_buckets.hpp); during the last micro-batch's backward the model
//                       reports each range whose gradient is final (Model::set_grad_ready_hook:
//                       head, lnf, the layers from the last op by op, the embeddings), and each
//                       bucket whose elements are all final is reduced at once on a worker thread,
//                       overlapped with the rest of the backward. A bucket's reduction is its part
//                       of the reduce-scatter below (each rank's part of a bucket is the bucket's
//                       window of its shard, so shards, the gradient norm and AdamW's ranges do
//                       not depend on the buckets), then its part of the all-gather (zero 0/1).
//                       Zero 2 reduces in every micro-batch instead (below, "ZeRO-2 memory").
//   reduce_gradients()  replaces model.finish_grads(): starts the buckets not reported yet (all of
//                       them if the backward did not report; under sequence parallelism the norm
//                       buckets, whose gradients sum_norm_grads finished after the backward) and
//                       waits for every bucket. Per bucket —
//                       exact: exact_reduce_scatter of the per-element exact sums (canonical mode:
//                       the model's ExactAccumulator; fast mode: its fp32 gradients), one rounding;
//                       the result is the rounded exact sum whatever the bucketing;
//                       fast: MPI_Reduce_scatter on fp32 (canonical mode rounds the bucket's exact
//                       sums first). Bucketing does not change the sum of an element as long as MPI
//                       reduces every element with the same tree for any message size, as Open
//                       MPI's libnbc reduce-scatter does (binomial reduction, then scatter; the
//                       mpi grad_buckets test checks it); an MPI that picked its algorithm by
//                       message size could round differently per bucket size, yet every replica
//                       still gets the same bits: each element is summed once, by its owner, and
//                       all-gathered.
//                       Then for zero 0 and 1 an fp32 all-gather of the reduced parts, so every
//                       rank holds the full gradient; zero 2 keeps only its shard (grad_shard();
//                       the model has no gradient buffer), rounded once here in canonical mode.
//                       (A float all-reduce would be one call, but MPI may round differently on
//                       different ranks; reduce-scatter + all-gather gives every replica the same bits.)
//   clip_grad_norm()    grad_clip.hpp. zero 0/1 without tp: the model's whole gradient (same
//                       on every rank); otherwise canonical chunk partials of this rank's part
//                       (zero 2: its shard, cut on chunk starts, exact_reduce.hpp; tp: tensors
//                       replicated across tp counted on tp rank 0 only), combined exactly over the
//                       ranks that hold different parts — the same bits as one process.
//   step()              zero 0: AdamW on every element, on every rank; zero 1/2: AdamW on this rank's
//                       shard only (m and v exist for the shard only), then an fp32 all-gather of
//                       the parameters.
// In canonical mode with reduce = exact the parameters after every step are bitwise those of the
// single-process run, for any dp, zero and bucket size.
//
// Overlap: the worker thread owns a duplicate of the dp group and drives its collectives to
// completion by polling (Open MPI progresses non-blocking collectives only inside MPI calls); its
// waits are the communicator's, so the watchdog ends a job whose peer died or hung with the
// usual message. It needs MPI_THREAD_MULTIPLE (Communicator::concurrent_threads()): without it,
// or with DpOptions::overlap off, the buckets are reduced one after the other in
// reduce_gradients(). overlap_stats() gives the last step's reduction time, the part of it the
// main thread waited for after the backward, and the share hidden behind the backward.
//
// ZeRO-2 memory: zero 2 saves the optimizer state (as zero 1), the gradient all-gather and the
// gradient memory. The model gives up its full gradient buffers (Model::set_grad_storage) and writes
// into Zero2Grads (zero2_grads.hpp): buckets of whole tensors staged in a small pool; in every
// micro-batch each bucket is reduce-scattered as soon as the backward has finished it, and this
// rank's part accumulated into its shard (exact reduction in canonical mode: the exact sums, one
// rounding after the last micro-batch — still the single process's bits; otherwise fp32 adds of
// each micro-batch's reduced part). A rank holds its shard, the staging pool and (sequence
// parallelism) the norm tensors' gradients, instead of N fp32 values (canonical: and N exact
// sums); it sends k reduce-scatters for k micro-batches instead of one (grad_bytes() and the
// trainer's comm_bytes show both). Without a worker thread, buckets are reduced on the main
// thread as they complete, so that their staging returns to the pool.
//
// ZeRO-3 memory: zero 3 is zero 2 whose parameters are sharded too: the model is built without its
// whole buffer (ModelOptions::sharded_params) and reads each layer's tensors from Zero3Params
// (zero3_params.hpp), which all-gathers them from every rank's shard before the layer runs, ahead
// of it on a worker where there is one. AdamW updates the shard in place, and there is no parameter
// all-gather after the step: the next passes gather what they use. The gathered values are the
// parameters' bits, so zero 3 computes what zero 2 computes.
//
// Under tensor parallelism the model's flat buffer holds this rank's tp shards; every dp member
// of the group holds the same shards, so all of the above works on that local buffer unchanged
// (shard cuts on local chunk starts are global chunk starts: tensor_parallel.hpp's alignment).
//
// Not here: the loop itself (src/train/trainer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/optim/adamw.hpp"
#include "src/optim/grad_clip.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/grad_buckets.hpp"
#include "src/parallel/zero2_grads.hpp"
#include "src/parallel/zero3_params.hpp"

namespace lockstep::parallel {

enum class ReduceMode : uint8_t { kExact, kFast };

// The highest ZeRO stage DataParallel runs.
inline constexpr int kMaxZeroStage = 3;
// What of a layout ZeRO-3 does not run with, and why ("" where it runs): pipeline stages (a
// stage's tied copy of wte is synced from whole parameters) and fp8 linears (they keep quantized
// copies of whole weights). The trainer refuses these, and the planner does not price them.
std::string zero3_layout_problem(int64_t pp, Precision linears);
const char* reduce_mode_name(ReduceMode m);

// A rank's share of the global batch.
struct DpBatch {
  int64_t local_batch = 0;  // sequences per rank per step (batch / dp)
  int64_t local_micro = 0;  // sequences per forward_backward on a rank
};

// batch sequences of seq_len tokens, micro-batches of `micro` sequences, split over dp ranks
// (`ranks` names them in messages: "[parallel] dp", or "[parallel] dp x ep" where expert
// parallelism adds data ranks). ConfigError (naming `source`) if dp does not divide the batch, if
// the local micro-batch does not divide the local batch, or, in canonical mode, if a rank's
// micro-batch is not a whole number of 64-token chunks (the gradient would then depend on the split).
DpBatch plan_dp_batch(int64_t batch, int64_t micro, int64_t seq_len, int64_t dp, Mode mode, const std::string& source,
                      const std::string& ranks = "[parallel] dp");

struct DpOptions {
  // Gradient bytes (fp32) per bucket; PyTorch DDP's default. The exact reduction sends twice as
  // many (a double per element).
  int64_t bucket_bytes = int64_t{25} << 20;
  // Reduce buckets during the backward on a worker thread (where MPI provides
  // MPI_THREAD_MULTIPLE); off: one after the other in reduce_gradients().
  bool overlap = true;
  // The model runs under sequence parallelism (its norm gradients cover this tp rank's tokens
  // until sum_norm_grads_over_tp).
  bool sequence_parallel = false;
  // The model's backward is split in two passes (ModelOptions::split_backward): the buckets are cut
  // between norm tensors and others as under sequence parallelism, so that none mixes the two
  // passes' gradients — every run of other tensors between two norms is one layer's linears (the
  // weight pass) or its embedding or MoE tensors (the first pass) — since ZeRO-2 stages a bucket
  // per micro-batch.
  bool split_backward = false;
  // The pipeline group when the model is one stage of several: the gradient norm then sums every
  // stage's part (exactly, as it sums dp and tp parts).
  comm::Communicator* pipeline = nullptr;
  // The ep group under expert parallelism (expert_parallel.hpp): the model holds its ep rank's
  // routed experts, and dp is the group of the ranks holding the same ones. In each bucket the
  // other tensors' gradients are summed over ep first (exactly in canonical mode, still unrounded),
  // then reduced over dp with the experts' — every micro-batch's under ZeRO 2 and 3; the loss sums
  // over dp and ep, the gradient norm counts the replicated tensors on ep rank 0.
  comm::Communicator* expert = nullptr;
};

class DataParallel {
 public:
  // tp: the model's tensor-parallel group; dp_tp: every rank holding a part of one model copy's
  // gradient (dp × tp; a group of one of each without parallelism). Installs the model's
  // grad-ready hook (removed by the destructor) and, with overlap, duplicates the dp group:
  // collective over dp.
  DataParallel(Model& model, comm::Communicator& dp, comm::Communicator& tp, comm::Communicator& dp_tp, int zero,
               ReduceMode reduce, AdamWConfig adam, DpOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int zero() const { return zero_; }
  const ShardPlan& plan() const { return plan_; }
  int64_t shard_first() const { return plan_.first(dp_.rank()); }
  int64_t shard_end() const { return plan_.end(dp_.rank()); }

  // Zero 3 with dp > 1: where the parameters are (nullptr otherwise: the model holds them whole).
  Zero3Params* sharded_params() { return params_.get(); }
  // Zero 3: the last step's parameter gathers (count, time, the main thread's wait).
  const OverlapStats& gather_stats() const { return gather_stats_; }

  // Sequence parallelism: sum_norm_grads over tp, on the model's buffers or (zero 2) on the
  // resident norm gradients. Before reduce_gradients(); collective over tp.
  void sum_norm_grads_over_tp();
  // Replaces model.finish_grads() after the last micro-batch (see the header comment).
  void reduce_gradients();
  // Zero 2 with dp > 1: this rank's reduced gradient shard (shard_end() - shard_first() floats;
  // the model then has no gradient buffer).
  bool grads_sharded() const { return staged_ != nullptr; }
  const float* grad_shard() const;
  // The gradient this rank holds after reduce_gradients(), what clipping and AdamW read: the
  // model's whole buffer, or (zero 2) this rank's shard.
  std::span<float> reduced_grads();
  // Bytes of gradient storage this rank holds: the model's buffers, ZeRO-2's shard and staging,
  // the reduction's scratch.
  uint64_t grad_bytes() const;
  // Zero 2: the most bytes the staging pool may hold (0 otherwise).
  uint64_t staging_budget_bytes() const { return staged_ ? staged_->budget_bytes() : 0; }
  // The buckets (none without data parallelism) and whether they overlap the backward.
  std::vector<GradBucket> buckets() const { return buckets_ ? buckets_->buckets() : std::vector<GradBucket>{}; }
  bool overlapped() const { return buckets_ && buckets_->threaded(); }
  // The last reduce_gradients()'s reduction time, exposed wait and hidden share (zeros without dp).
  OverlapStats overlap_stats() const { return buckets_ ? buckets_->last_step() : OverlapStats{}; }
  // The global loss sum over the data ranks (exact; same bits as one process's combiner).
  float reduce_loss(const ChunkCombiner& local) { return combine_exact(local, dp_, {ep_}); }
  // Global gradient norm before clipping (same on every rank); clips by grad_clip.hpp.
  float clip_grad_norm(float max_norm);
  // AdamW with 1-based step t, then (zero 1/2) the parameter all-gather; zero 3 updates its shard.
  void step(float lr, int64_t t);

  // Every rank's shard (`mine`: shard_end() - shard_first() floats) gathered into `out` (num_params
  // floats, each shard at its place): e.g. the whole ZeRO-2 gradient for a dump. Collective over dp.
  void gather_shards(const float* mine, float* out);
  // Bytes of AdamW state (m and v) held by this rank.
  uint64_t optimizer_state_bytes() const;
  // This rank's AdamW moments: all of them (zero 0) or its shard (zero 1/2).
  std::span<float> moments_m() { return replicated_ ? std::span<float>(replicated_->m()) : std::span<float>(m_); }
  std::span<float> moments_v() { return replicated_ ? std::span<float>(replicated_->v()) : std::span<float>(v_); }

 private:
  void adamw_shard(float lr, int64_t t);
  void all_gather_shards(float* buf);
  // The model reports [first, end) final: under sequence parallelism its norm tensors wait for
  // reduce_gradients() (sum_norm_grads finishes them after the backward).
  void on_grads_ready(int64_t first, int64_t end, bool last_micro);
  // The model's gradient storage: its exact sums (canonical mode) or fp32 values.
  GradSink model_grads();
  // Expert parallelism: the replicated tensors' gradients among the flat buffer's elements
  // [first, end), held in g from its first element, summed over ep (a bucket's, before its
  // reduction over dp; on the worker's duplicate of ep where there is one).
  void sum_replicated_over_ep(GradSink g, int64_t first, int64_t end);
  // One bucket's part of the reduce-scatter (and all-gather, zero 0/1), on the worker's group.
  void reduce_bucket(const GradBucket& bucket);
  // Zero 2: one micro-batch's bucket from its staging, reduce-scattered and added to the shard.
  void reduce_staged(const GradBucket& bucket);
  // Its elements [first, end), staged at lo.. in g.
  void reduce_staged_piece(const GradSink& g, int64_t lo, int64_t first, int64_t end);
  // Gradient element i (global index; under zero 2 inside this rank's shard).
  float* grad_at(int64_t i);

  Model& model_;
  comm::Communicator& dp_;
  comm::Communicator& tp_;
  comm::Communicator& dp_tp_;
  int zero_;
  ReduceMode reduce_;
  AdamWConfig adam_;
  ShardPlan plan_;
  int64_t bucket_elems_ = 0;  // DpOptions::bucket_bytes in fp32 elements
  bool sp_ = false;           // DpOptions::sequence_parallel
  comm::Communicator* pipeline_ = nullptr;  // DpOptions::pipeline
  comm::Communicator* ep_ = nullptr;        // DpOptions::expert (ep > 1 only)
  std::unique_ptr<AdamW> replicated_;  // zero 0
  std::vector<float> m_, v_;           // zero 1/2: this rank's shard
  std::vector<float> shard_;           // zero 0/1: reduced gradient shard (scratch; buckets write disjoint parts)
  std::vector<float> part_, rounded_;  // zero 2: a bucket's reduced part, its rounded exact sums
  std::unique_ptr<Zero2Grads> staged_;             // zero 2 and 3 with dp > 1
  std::unique_ptr<Zero3Params> params_;            // zero 3 with dp > 1
  OverlapStats gather_stats_;
  std::unique_ptr<comm::Communicator> grad_comm_;  // the worker's duplicate of dp (overlap only)
  std::unique_ptr<comm::Communicator> ep_comm_;    // the worker's duplicate of ep (overlap with ep only)
  std::unique_ptr<BucketScheduler> buckets_;       // last: its worker goes first
};

}  // namespace lockstep::parallel
