// Data parallelism with ZeRO-0/1/2/3 (see data_parallel.hpp).
#include "src/parallel/data_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "src/core/check.hpp"
#include "src/parallel/tensor_parallel.hpp"

namespace lockstep::parallel {

const char* reduce_mode_name(ReduceMode m) { return m == ReduceMode::kExact ? "exact" : "fast"; }

std::string zero3_layout_problem(int64_t pp, Precision linears) {
  if (pp > 1) return "[parallel] pp > 1 (a stage's tied copy of wte is synced from whole parameters)";
  if (linears == Precision::kFp8) return "[train] precision = \"fp8\" (fp8 linears keep quantized copies of whole weights)";
  return "";
}

DpBatch plan_dp_batch(int64_t batch, int64_t micro, int64_t seq_len, int64_t dp, Mode mode, const std::string& source,
                      const std::string& ranks) {
  LS_REQUIRE(batch % dp == 0, source, ": [train] batch_size (", batch, ") must be a multiple of ", ranks, " (", dp,
             "): every rank reads batch_size / ", dp, " sequences of the global batch");
  DpBatch b;
  b.local_batch = batch / dp;
  b.local_micro = std::min(micro, b.local_batch);
  LS_REQUIRE(b.local_batch % b.local_micro == 0, source, ": [train] micro_batch_size (", micro,
             ") must divide batch_size / ", ranks, " (", batch, " / ", dp, " = ", b.local_batch, ")");
  // Canonical mode: every rank's micro-batch must end on a 64-token chunk boundary of the global
  // batch, or the weight-gradient chunks would be cut differently from the single-process run.
  LS_REQUIRE(mode != Mode::kCanonical || dp == 1 || (b.local_micro * seq_len) % kCanonicalChunk == 0, source,
             ": a rank's micro-batch of ", b.local_micro, " sequences x seq_len ", seq_len, " = ",
             b.local_micro * seq_len, " tokens is not a multiple of ", kCanonicalChunk,
             " in canonical mode (batch_size ", batch, " / ", ranks, " ", dp,
             "): gradient chunks would straddle ranks; choose a batch_size, micro_batch_size or dp that makes it one");
  return b;
}

DataParallel::DataParallel(Model& model, comm::Communicator& dp, comm::Communicator& tp, comm::Communicator& dp_tp,
                           int zero, ReduceMode reduce, AdamWConfig adam, DpOptions options)
    : model_(model), dp_(dp), tp_(tp), dp_tp_(dp_tp), zero_(zero), reduce_(reduce), adam_(adam),
      plan_(make_shard_plan(model.param_layout(), dp.size())), sp_(options.sequence_parallel),
      pipeline_(options.pipeline != nullptr && options.pipeline->size() > 1 ? options.pipeline : nullptr),
      ep_(options.expert != nullptr && options.expert->size() > 1 ? options.expert : nullptr) {
  LS_CHECK(zero >= 0 && zero <= kMaxZeroStage, "zero ", zero);
  LS_CHECK(options.bucket_bytes >= 1, "bucket_bytes ", options.bucket_bytes);
  if (zero_ == 0 || dp_.size() == 1) {
    replicated_ = std::make_unique<AdamW>(model_, adam_);
  } else {
    m_.assign(static_cast<size_t>(plan_.size(dp_.rank())), 0.0f);
    v_.assign(m_.size(), 0.0f);
  }
  if (dp_.size() == 1) return;
  // Every rank decides alike: the thread level is the job's.
  const bool threaded = options.overlap && dp_.concurrent_threads() && tp_.concurrent_threads();
  if (threaded) grad_comm_ = dp_.split(0, dp_.rank(), dp_.name());
  if (threaded && ep_ != nullptr) ep_comm_ = ep_->split(0, ep_->rank(), ep_->name());
  bucket_elems_ = std::max<int64_t>(1, options.bucket_bytes / static_cast<int64_t>(sizeof(float)));
  std::vector<int64_t> chunk_starts;
  for (size_t c = 1; c < model_.num_chunks(); ++c) chunk_starts.push_back(model_.chunk_params_first(c));
  std::vector<GradBucket> buckets =
      plan_grad_buckets(model_.param_layout(), bucket_elems_, sp_ || options.split_backward, zero_ >= 2, chunk_starts);
  if (zero_ >= 2) {
    // Budget: the largest bucket and three of the next largest (zero2_grads.hpp).
    std::vector<int64_t> sizes;
    for (const GradBucket& b : buckets) sizes.push_back(b.size());
    std::sort(sizes.rbegin(), sizes.rend());
    const int64_t budget = sizes[0] + 3 * (sizes.size() > 1 ? sizes[1] : 0);
    const bool exact_shard = reduce_ == ReduceMode::kExact && model_.mode() == Mode::kCanonical;
    staged_ = std::make_unique<Zero2Grads>(model_.param_layout(), buckets, model_.mode(), shard_first(),
                                           shard_end(), exact_shard, sp_, budget);
    model_.set_grad_storage(staged_.get());
  } else {
    shard_.assign(static_cast<size_t>(plan_.size(dp_.rank())), 0.0f);
  }
  if (zero_ == 3) params_ = std::make_unique<Zero3Params>(model_, dp_, plan_, threaded);
  // Under zero 2 and 3 the staging pool needs every complete bucket reduced during the backward:
  // at once on this thread when there is no worker.
  buckets_ = std::make_unique<BucketScheduler>(
      std::move(buckets), [this](const GradBucket& b) { reduce_bucket(b); }, threaded, zero_ >= 2,
      [this](size_t b) {
        if (staged_) staged_->close(b);
      });
  model_.set_grad_ready_hook([this](int64_t first, int64_t end, bool last) { on_grads_ready(first, end, last); });
}

DataParallel::~DataParallel() {
  if (!buckets_) return;
  model_.set_grad_ready_hook({});
  if (staged_) model_.set_grad_storage(nullptr);
}

const float* DataParallel::grad_shard() const {
  LS_CHECK(staged_ != nullptr, "grad_shard: gradients are not sharded (zero ", zero_, ", dp ", dp_.size(), ")");
  return staged_->shard();
}

std::span<float> DataParallel::reduced_grads() {
  if (staged_) return {staged_->shard(), static_cast<size_t>(shard_end() - shard_first())};
  return {model_.grads(), static_cast<size_t>(model_.num_params())};
}

uint64_t DataParallel::grad_bytes() const {
  const uint64_t scratch = (shard_.size() + part_.size() + rounded_.size()) * sizeof(float);
  return model_.grad_bytes() + (staged_ ? staged_->bytes() : 0) + scratch;
}

float* DataParallel::grad_at(int64_t i) {
  return staged_ ? staged_->shard() + (i - shard_first()) : model_.grads() + i;
}

void DataParallel::gather_shards(const float* mine, float* out) {
  dp_.all_gatherv(mine, out, plan_.sizes(), plan_.firsts(), DType::kF32);
}

void DataParallel::all_gather_shards(float* buf) {
  const std::vector<float> mine(buf + shard_first(), buf + shard_end());  // MPI may not send from buf
  gather_shards(mine.data(), buf);
}

void DataParallel::on_grads_ready(int64_t first, int64_t end, bool last) {
  if (!staged_ && !last) return;  // zero 0/1 reduce the step's sum: only the last micro-batch's
  if (!sp_) {
    buckets_->mark_ready(first, end);
    return;
  }
  for (const auto& t : model_.param_layout()) {
    const int64_t a = std::max(first, t.offset), b = std::min(end, t.offset + t.numel);
    if (a < b && !t.is_norm()) buckets_->mark_ready(a, b);
  }
}

GradSink DataParallel::model_grads() {
  return model_.mode() == Mode::kCanonical ? GradSink{nullptr, &model_.exact_grads(), 0}
                                           : GradSink{model_.grads(), nullptr, 0};
}

void DataParallel::sum_replicated_over_ep(GradSink g, int64_t first, int64_t end) {
  // Element i of [first, end) is g's element i - first (of its exact sums from g.offset).
  const int64_t at = g.exact != nullptr ? g.offset : 0;
  std::vector<ElementRange> ranges;  // the same on every ep rank: their layouts have the same shapes
  for (const auto& t : model_.param_layout()) {
    const int64_t a = std::max(first, t.offset), b = std::min(end, t.offset + t.numel);
    if (a >= b || t.is_expert()) continue;
    if (!ranges.empty() && ranges.back().end == at + (a - first)) {
      ranges.back().end = at + (b - first);
    } else {
      ranges.push_back({at + (a - first), at + (b - first)});
    }
  }
  if (!ranges.empty()) sum_over_group(g, ranges, ep_comm_ ? *ep_comm_ : *ep_);
}

void DataParallel::reduce_staged(const GradBucket& bucket) {
  const auto b = static_cast<size_t>(
      std::lower_bound(buckets_->buckets().begin(), buckets_->buckets().end(), bucket.first,
                       [](const GradBucket& x, int64_t first) { return x.first < first; }) -
      buckets_->buckets().begin());
  const GradSink g = staged_->staged(b);
  if (ep_) sum_replicated_over_ep(g, bucket.first, bucket.end);
  // In pieces of about bucket_elems_ cut on valid cuts, as zero 0/1's buckets are: a whole-tensor
  // bucket can be one large tensor (wte), and the reduction's scratch (receive buffers, the
  // owner's exact sums) grows with what one collective reduces.
  for (int64_t first = bucket.first; first < bucket.end;) {
    const int64_t end = std::min(bucket.end, first_valid_cut(model_.param_layout(), std::min(first + bucket_elems_, bucket.end)));
    reduce_staged_piece(g, first - bucket.first, first, end);
    first = end;
  }
  staged_->release(b);
}

void DataParallel::reduce_staged_piece(const GradSink& g, int64_t lo, int64_t first, int64_t end) {
  comm::Communicator& comm = grad_comm_ ? *grad_comm_ : dp_;
  const ShardPlan window = plan_.window(first, end);
  const int64_t mine = first + window.first(comm.rank()), n = window.size(comm.rank());
  const int64_t at = n > 0 ? mine - shard_first() : 0;  // where this rank's part goes in the shard
  if (reduce_ == ReduceMode::kExact && g.exact) {
    exact_reduce_scatter_add(*g.exact, window, comm, staged_->shard_exact(), at, g.offset + lo);
    return;
  }
  part_.resize(static_cast<size_t>(n));
  const float* send = g.exact ? nullptr : g.f32 + lo;
  if (g.exact) {  // canonical mode, fast reduction: this rank's exact sums rounded once
    rounded_.resize(static_cast<size_t>(end - first));
    g.exact->round_to(static_cast<size_t>(g.offset + lo), static_cast<size_t>(g.offset + lo + end - first),
                      rounded_.data());
    send = rounded_.data();
  }
  if (reduce_ == ReduceMode::kExact) {
    exact_reduce_scatter(send, window, comm, part_.data());
  } else {
    comm.reduce_scatter(send, part_.data(), window.sizes(), DType::kF32, comm::ReduceOp::kSum);
  }
  float* shard = staged_->shard() + at;
  for (int64_t i = 0; i < n; ++i) shard[i] += part_[static_cast<size_t>(i)];
}

void DataParallel::reduce_bucket(const GradBucket& bucket) {
  if (staged_) {
    reduce_staged(bucket);
    return;
  }
  comm::Communicator& comm = grad_comm_ ? *grad_comm_ : dp_;
  if (ep_) sum_replicated_over_ep(model_grads(), bucket.first, bucket.end);
  const ShardPlan window = plan_.window(bucket.first, bucket.end);
  const std::vector<int64_t> sizes = window.sizes();
  // This rank's part of the bucket, [mine, mine + n), and where it goes in shard_.
  const int64_t mine = bucket.first + window.first(comm.rank()), n = window.size(comm.rank());
  float* part = n > 0 ? shard_.data() + (mine - shard_first()) : shard_.data();
  float* grads = model_.grads() + bucket.first;
  if (reduce_ == ReduceMode::kExact) {
    if (model_.mode() == Mode::kCanonical) {
      exact_reduce_scatter(model_.exact_grads(), window, comm, part, bucket.first);
    } else {
      exact_reduce_scatter(grads, window, comm, part);
    }
  } else {
    model_.finish_grads(bucket.first, bucket.end);  // canonical: this rank's exact sums rounded once
    comm.reduce_scatter(grads, part, sizes, DType::kF32, comm::ReduceOp::kSum);
  }
  comm.all_gatherv(part, grads, sizes, window.firsts(), DType::kF32);
}

void DataParallel::sum_norm_grads_over_tp() {
  if (staged_) {
    const ElementRange resident{0, staged_->resident_elements()};
    sum_over_group(staged_->resident_storage(), {&resident, 1}, tp_);
  } else {
    sum_norm_grads(model_, tp_);
  }
}

void DataParallel::reduce_gradients() {
  if (dp_.size() == 1) {
    if (ep_) sum_replicated_over_ep(model_grads(), 0, model_.num_params());  // no buckets do it
    model_.finish_grads();
    return;
  }
  buckets_->finish();
  if (staged_) staged_->finish_shard();
  if (grad_comm_) dp_.absorb_stats(*grad_comm_);  // the trainer counts bytes on dp (and ep)
  if (ep_comm_) ep_->absorb_stats(*ep_comm_);
  if (params_) {
    params_->absorb_into(dp_);
    gather_stats_ = params_->take_stats();
  }
}

float DataParallel::clip_grad_norm(float max_norm) {
  const bool sharded = zero_ >= 2 && dp_.size() > 1;
  if (!sharded && tp_.size() == 1 && pipeline_ == nullptr && ep_ == nullptr) {
    return lockstep::clip_grad_norm(model_, max_norm);
  }
  // This rank's part: its ZeRO-2 shard (else all of its buffer), tensors replicated across tp only
  // on tp rank 0 and (expert parallelism) those replicated across ep only on ep rank 0, so that
  // every element of the global gradient counts once. Shard cuts are chunk starts of their tensor
  // (make_shard_plan) and tp shards are runs of global chunks, so each piece's chunks are those of
  // one process.
  const int64_t first = sharded ? shard_first() : 0, end = sharded ? shard_end() : model_.num_params();
  comm::Communicator& group = sharded ? dp_tp_ : tp_;
  const GradPart part{first, end, grad_at(first), tp_.rank() != 0, ep_ != nullptr && ep_->rank() != 0};
  return lockstep::clip_grad_norm(model_, part, max_norm, [&](const ChunkCombiner& own) {
    return combine_exact(own, group, {ep_, pipeline_});
  });
}

void DataParallel::adamw_shard(float lr, int64_t t) {
  float* params = params_ ? params_->shard() : model_.params() + shard_first();
  adamw_update_range(model_, adam_, lr, t, shard_first(), shard_end(), params, m_.data(), v_.data(),
                     grad_at(shard_first()));
}

void DataParallel::step(float lr, int64_t t) {
  if (replicated_) {
    replicated_->update(model_, lr, t);
    return;
  }
  adamw_shard(lr, t);
  if (params_) {
    params_->invalidate();
  } else {
    all_gather_shards(model_.params());
  }
}

uint64_t DataParallel::optimizer_state_bytes() const {
  const size_t n = replicated_ ? replicated_->m().size() + replicated_->v().size() : m_.size() + v_.size();
  return n * sizeof(float);
}

}  // namespace lockstep::parallel
