// Gradient buckets: the flat gradient buffer cut into runs of about `bucket_bytes`, each reduced
// as soon as the backward pass has finished it, overlapped with the rest of the backward pass
// (PyTorch DDP's buckets; here in the buffer's own order, since the model reports ranges of it).
//
// plan_grad_buckets cuts on valid shard cuts (exact_reduce.hpp: chunk starts of a tensor, or
// tensor ends), so each bucket's part of the dp reduce-scatter is a run of whole canonical
// chunks of every shard, and the union of the buckets' reduce-scatters is the global one.
//
// BucketScheduler counts, per bucket, the elements reported final (mark_ready) and runs the
// reduction of a bucket once all of its elements are, in the order buckets complete — the same
// order on every rank, since every rank runs the same backward — on a worker thread of its own,
// or (without one) in finish(). The worker is what makes the overlap real: Open MPI's non-blocking
// collectives on CPU progress only inside MPI calls (no progress thread in Debian's build), so a
// collective merely started during the backward would sit idle until the main thread waited on
// it; the worker starts each bucket's collectives and polls them (Handle::wait, the watchdog
// included) while the main thread computes. It needs MPI_THREAD_MULTIPLE (the main thread runs
// tensor-parallel collectives meanwhile) and its own communicator (a dp group duplicate) so that
// its collectives never interleave with the main thread's on one group.
//
// Timing (OverlapStats): `comm_s` is the time the reductions took on the worker (from a bucket's
// start to its last wait), `exposed_s` the time the main thread spent in finish() waiting for
// them; hidden = 1 − exposed/comm is the share of communication that ran behind the backward.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "src/model/param_layout.hpp"

namespace lockstep::parallel {

// Elements [first, end) of the flat gradient buffer.
struct GradBucket {
  int64_t first = 0, end = 0;
  int64_t size() const { return end - first; }
};

// Buckets of about bucket_elems elements in buffer order: each ends at the first valid cut at or
// after first + bucket_elems (one 64-element chunk when bucket_elems is smaller; the whole buffer
// when it is larger). With split_norms, also cut wherever the buffer passes between norm tensors
// and others, so that no bucket mixes them (sequence parallelism finishes norm gradients later).
// whole_tensors: cut only between tensors (at the first tensor end at or after first +
// bucket_elems), so that each tensor lies in one bucket (ZeRO-2 stages a bucket as one buffer and
// the model writes a tensor through one pointer). `cuts` (tensor starts) are cut at too: a model's
// chunk starts, so that a bucket's gradients come from one chunk's backward (ZeRO-2 reduces a
// bucket once its elements of one micro-batch are all in, and an interleaved pipeline runs the
// chunks' backwards of different micro-batches in between).
std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamTensor>& layout, int64_t bucket_elems,
                                          bool split_norms, bool whole_tensors = false,
                                          std::span<const int64_t> cuts = {});

// Last step's figures (see the header comment).
struct OverlapStats {
  int transfers = 0;     // buckets reduced (or, for ZeRO-3's gathers, layers gathered)
  double comm_s = 0;     // reductions, summed over buckets
  double exposed_s = 0;  // the main thread's wait for them after the backward
  double hidden_share() const { return comm_s > 0 ? 1.0 - std::min(exposed_s, comm_s) / comm_s : 0.0; }
};

class BucketScheduler {
 public:
  // reduce(bucket) performs one bucket's reduction (collectives on a group no other thread uses
  // meanwhile). threaded: run it on the worker as buckets complete; otherwise in finish().
  // every_micro_batch (ZeRO-2: each micro-batch's gradient is reduced on its own): a bucket
  // completes in every micro-batch, its count restarting, and without a worker it is reduced at
  // once on the caller's thread. complete(b), if given, runs on the main thread as bucket b
  // completes, before its reduction.
  BucketScheduler(std::vector<GradBucket> buckets, std::function<void(const GradBucket&)> reduce, bool threaded,
                  bool every_micro_batch = false, std::function<void(size_t)> complete = {});
  // Waits for the reductions already started (their buffers are in use), then ends the worker.
  ~BucketScheduler();
  BucketScheduler(const BucketScheduler&) = delete;
  BucketScheduler& operator=(const BucketScheduler&) = delete;

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  bool threaded() const { return worker_.joinable(); }

  // Elements [first, end) are ready; each element is reported at most once per step (with
  // every_micro_batch: once before its bucket completes). A bucket that becomes complete is handed
  // to the worker. Main thread only.
  void mark_ready(int64_t first, int64_t end);
  // Starts every bucket that has not completed this step (buckets in buffer order), waits until
  // every bucket is reduced, rethrows the first error of a reduction, and starts the next step.
  void finish();
  const OverlapStats& last_step() const { return last_; }

 private:
  void start(size_t bucket);
  void run_worker();

  std::vector<GradBucket> buckets_;
  std::function<void(const GradBucket&)> reduce_;
  bool every_micro_batch_;
  std::function<void(size_t)> complete_;
  std::vector<int64_t> ready_;    // elements of each bucket reported since it last completed
  std::vector<uint8_t> started_;  // bucket handed over this step
  OverlapStats last_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;  // complete buckets not yet taken by the worker
  size_t in_flight_ = 0;      // handed over and not yet reduced
  double comm_s_ = 0;         // this step's reductions so far
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;  // last: started once the rest is constructed
};

}  // namespace lockstep::parallel
