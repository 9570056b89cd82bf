// ZeRO-2 gradient memory: all the gradient storage of one data-parallel rank under zero 2 — this
// rank's shard of the reduced gradient, and staging for the buckets the backward is writing.
//
// The model writes each parameter's gradient through GradStorage (sink()). A bucket (whole
// tensors: plan_grad_buckets with whole_tensors) gets a staging buffer from a pool when the
// backward first writes to it in a micro-batch, zeroed; the bucket is reduced as soon as the
// backward has reported all of its elements (close(), then the reduction on the dp worker reads
// staged() and accumulates its part into the shard), and its buffer goes back to the pool
// (release()). A tied wte is written twice per micro-batch (by the head, first, and by the
// embedding, last): its bucket stays open, holding its buffer, for the whole backward.
//
// Shard accumulation over micro-batches (each micro-batch's bucket is reduced on its own):
//   exact reduction, canonical mode: the exact sums (ExactAccumulator over the shard) of every
//     rank's exact per-micro-batch sums, rounded once in finish_shard() — the rounding of the exact
//     sum over micro-batches, ranks and chunks, i.e. the single process's bits;
//   otherwise: the fp32 shard += each micro-batch's reduced fp32 part (fast mode's fp32 adds).
//
// Staging pool: buffers are kept from step to step (no allocation in the steady state) and reused
// best-fit by size; their total stays within a budget of elements (DataParallel: the largest
// bucket plus three of the next largest — the backward holds at most the tied wte's bucket, the
// bucket it writes and the next one, where one op writes a weight and a bias in two buckets, and
// the rest lets one reduction run behind). A bucket that does not fit waits for a reduction in
// flight to return its buffer; if none is in flight, free buffers of other sizes are dropped; if
// the bucket still does not fit, the backward could never go on: an error names the sizes.
//
// Resident tensors: under sequence parallelism the norm tensors' gradients need the sum over tp
// (sum_over_group) after the last micro-batch before their dp reduction, so they keep persistent
// storage for the step (2·C elements per norm: small) and their buckets are reduced once, in
// DataParallel::reduce_gradients().
//
// Not here: the collectives (data_parallel.cpp); when a bucket is complete (grad_buckets.hpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"
#include "src/model/model.hpp"
#include "src/parallel/grad_buckets.hpp"

namespace lockstep::parallel {

class Zero2Grads final : public GradStorage {
 public:
  // buckets: whole-tensor buckets of `layout`; [shard_first, shard_end): this rank's shard;
  // exact_shard: accumulate the shard exactly (canonical mode, exact reduction); resident_norms:
  // keep the norm tensors resident (sequence parallelism; their buckets hold norms only).
  Zero2Grads(const std::vector<ParamTensor>& layout, std::vector<GradBucket> buckets, Mode mode,
             int64_t shard_first, int64_t shard_end, bool exact_shard, bool resident_norms, int64_t budget_elems);

  // GradStorage (main thread). sink() may wait for a reduction to return a buffer.
  GradSink sink(const ParamTensor& t) override;
  void zero() override;

  // Main thread: bucket b is complete for this micro-batch; it goes to its reduction.
  void close(size_t b);
  // Bucket b's gradient for its reduction: element i of the bucket is f32[i] (fast mode) or the
  // exact sum at exact->(offset + i) (canonical mode).
  GradSink staged(size_t b) const;
  // Bucket b's reduction is done: its staging buffer goes back to the pool (any thread).
  void release(size_t b);
  bool resident(size_t b) const { return resident_[b] != 0; }
  // The resident norms' storage (elements 0 .. n-1, in buffer order) and n.
  GradSink resident_storage() { return {resident_f32_.data(), exact_ ? &resident_exact_ : nullptr, 0}; }
  int64_t resident_elements() const { return resident_elements_; }

  // The shard: fp32 values (shard_end - shard_first) and, with exact_shard, the exact sums that
  // finish_shard() rounds into them.
  float* shard() { return shard_.data(); }
  ExactAccumulator& shard_exact() { return shard_exact_; }
  void finish_shard();

  int64_t budget() const { return budget_; }
  uint64_t budget_bytes() const { return static_cast<uint64_t>(budget_) * element_bytes(); }
  // Bytes of gradient storage held: shard, resident tensors, and the most the staging buffers
  // have held at once so far (buffers of other sizes are dropped and allocated as the backward's
  // buckets come; the high-water mark is what the process needs).
  uint64_t bytes() const;

 private:
  struct Buffer {
    int64_t capacity = 0;
    std::vector<float> f32;  // fast mode
    ExactAccumulator exact;  // canonical mode
  };
  // A buffer of at least n elements from the pool, waiting (on `lock`, held) for one to return if
  // the budget is spent; ConfigError if none can come.
  void allocate(std::unique_lock<std::mutex>& lock, Buffer*& out, int64_t n);
  // The tensor holding flat element `offset`.
  size_t tensor_at(int64_t offset) const;
  uint64_t element_bytes() const { return exact_ ? sizeof(double) + 1 : sizeof(float); }

  std::vector<ParamTensor> layout_;
  std::vector<GradBucket> buckets_;
  bool exact_;  // canonical mode: staging and resident tensors hold exact sums
  int64_t budget_;
  std::vector<uint8_t> resident_;          // per bucket
  std::vector<int64_t> resident_pos_;      // per tensor: its first element in the resident storage, or -1
  int64_t resident_elements_ = 0;
  std::vector<float> resident_f32_;
  ExactAccumulator resident_exact_;
  std::vector<float> shard_;
  ExactAccumulator shard_exact_;

  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<Buffer*> free_;
  std::vector<Buffer*> held_;  // per bucket: its buffer while the backward writes it
  // Per bucket: buffers closed and not yet released, oldest first (the worker may still reduce one
  // micro-batch's bucket when the next micro-batch closes it again).
  std::vector<std::deque<Buffer*>> reducing_;
  int64_t allocated_ = 0;      // elements of capacity over buffers_
  int64_t allocated_peak_ = 0;
  int64_t closed_ = 0;         // buckets handed to their reduction and not yet released
};

}  // namespace lockstep::parallel
