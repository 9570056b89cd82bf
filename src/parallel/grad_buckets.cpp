// Gradient buckets and their overlapped reduction (see grad_buckets.hpp).
#include "src/parallel/grad_buckets.hpp"

#include <algorithm>
#include <chrono>

#include "src/core/check.hpp"
#include "src/parallel/exact_reduce.hpp"

namespace lockstep::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamTensor>& layout, int64_t bucket_elems,
                                          bool split_norms, bool whole_tensors, std::span<const int64_t> cuts) {
  LS_CHECK(!layout.empty() && bucket_elems >= 1, "bucket of ", bucket_elems, " elements");
  const int64_t n = layout.back().offset + layout.back().numel;
  // Tensor starts where the buffer passes between norm and other tensors, and the caller's cuts.
  std::vector<int64_t> forced(cuts.begin(), cuts.end());
  for (size_t i = 1; split_norms && i < layout.size(); ++i) {
    if (layout[i].is_norm() != layout[i - 1].is_norm()) forced.push_back(layout[i].offset);
  }
  std::sort(forced.begin(), forced.end());
  std::vector<GradBucket> buckets;
  for (int64_t first = 0; first < n;) {
    const int64_t target = std::min(first + bucket_elems, n);
    int64_t end = first_valid_cut(layout, target);
    if (whole_tensors) {  // the end of the tensor holding element target - 1
      const auto t = std::upper_bound(layout.begin(), layout.end(), target - 1,
                                      [](int64_t x, const ParamTensor& p) { return x < p.offset + p.numel; });
      end = t->offset + t->numel;
    }
    const auto next_forced = std::upper_bound(forced.begin(), forced.end(), first);
    if (next_forced != forced.end()) end = std::min(end, *next_forced);
    buckets.push_back({first, end});
    first = end;
  }
  return buckets;
}

BucketScheduler::BucketScheduler(std::vector<GradBucket> buckets, std::function<void(const GradBucket&)> reduce,
                                 bool threaded, bool every_micro_batch, std::function<void(size_t)> complete)
    : buckets_(std::move(buckets)), reduce_(std::move(reduce)), every_micro_batch_(every_micro_batch),
      complete_(std::move(complete)),
      ready_(buckets_.size(), 0), started_(buckets_.size(), 0) {
  LS_CHECK(!buckets_.empty());
  if (threaded) worker_ = std::thread([this] { run_worker(); });
}

BucketScheduler::~BucketScheduler() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BucketScheduler::mark_ready(int64_t first, int64_t end) {
  // The first bucket that ends after `first`.
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), first,
                             [](int64_t x, const GradBucket& b) { return x < b.end; });
  for (; it != buckets_.end() && it->first < end; ++it) {
    const auto b = static_cast<size_t>(it - buckets_.begin());
    ready_[b] += std::min(end, it->end) - std::max(first, it->first);
    LS_CHECK(ready_[b] <= it->size(), "gradient elements of bucket ", b, " reported final twice");
    if (ready_[b] == it->size()) {
      if (every_micro_batch_) ready_[b] = 0;
      start(b);
    }
  }
}

void BucketScheduler::start(size_t b) {
  started_[b] = 1;
  if (complete_) complete_(b);
  if (!threaded()) {
    if (!every_micro_batch_) return;  // reduced in finish()
    const auto t0 = Clock::now();
    reduce_(buckets_[b]);
    comm_s_ += seconds_since(t0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(b);
    ++in_flight_;
  }
  cv_.notify_all();
}

void BucketScheduler::run_worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and nothing left in flight
    const size_t b = queue_.front();
    queue_.pop_front();
    const bool skip = error_ != nullptr;  // a failed reduction leaves the step to the error
    lock.unlock();
    const auto t0 = Clock::now();
    std::exception_ptr error;
    if (!skip) {
      try {
        reduce_(buckets_[b]);
      } catch (...) {
        error = std::current_exception();
      }
    }
    const double dt = seconds_since(t0);
    lock.lock();
    comm_s_ += dt;
    if (error && !error_) error_ = error;
    --in_flight_;
    cv_.notify_all();
  }
}

void BucketScheduler::finish() {
  const auto t0 = Clock::now();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!started_[b]) start(b);
  }
  double comm_s = 0;
  std::exception_ptr error;
  if (threaded()) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return in_flight_ == 0; });
    comm_s = comm_s_;
    comm_s_ = 0;
    std::swap(error, error_);
  } else if (!every_micro_batch_) {
    for (const GradBucket& bucket : buckets_) reduce_(bucket);
  }
  last_.transfers = static_cast<int>(buckets_.size());
  last_.exposed_s = seconds_since(t0);
  // Without a worker nothing overlaps: per-micro-batch reductions ran inside the backward, on its thread.
  last_.comm_s = threaded() ? comm_s : (every_micro_batch_ ? comm_s_ : last_.exposed_s);
  if (!threaded()) last_.exposed_s = last_.comm_s;
  comm_s_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(started_.begin(), started_.end(), uint8_t{0});
  if (error) std::rethrow_exception(error);
}

}  // namespace lockstep::parallel
