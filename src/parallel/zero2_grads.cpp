// ZeRO-2 gradient memory (see zero2_grads.hpp).
#include "src/parallel/zero2_grads.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace lockstep::parallel {

Zero2Grads::Zero2Grads(const std::vector<ParamTensor>& layout, std::vector<GradBucket> buckets, Mode mode,
                       int64_t shard_first, int64_t shard_end, bool exact_shard, bool resident_norms,
                       int64_t budget_elems)
    : layout_(layout), buckets_(std::move(buckets)), exact_(mode == Mode::kCanonical), budget_(budget_elems),
      resident_(buckets_.size(), 0), resident_pos_(layout_.size(), -1),
      shard_(static_cast<size_t>(shard_end - shard_first), 0.0f), held_(buckets_.size(), nullptr),
      reducing_(buckets_.size()) {
  if (exact_shard) shard_exact_.reset(shard_.size());
  int64_t resident = 0;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (!resident_norms || !layout_[i].is_norm()) continue;
    resident_pos_[i] = resident;
    resident += layout_[i].numel;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const ParamTensor& first = layout_[static_cast<size_t>(tensor_at(buckets_[b].first))];
    LS_CHECK(first.offset == buckets_[b].first, "bucket ", b, " does not start on a tensor");
    resident_[b] = resident_norms && first.is_norm();
  }
  resident_elements_ = resident;
  if (exact_) {
    resident_exact_.reset(static_cast<size_t>(resident));
  } else {
    resident_f32_.assign(static_cast<size_t>(resident), 0.0f);
  }
}

size_t Zero2Grads::tensor_at(int64_t offset) const {
  const auto it = std::upper_bound(layout_.begin(), layout_.end(), offset,
                                   [](int64_t x, const ParamTensor& t) { return x < t.offset + t.numel; });
  LS_CHECK(it != layout_.end(), "offset ", offset, " outside the gradient buffer");
  return static_cast<size_t>(it - layout_.begin());
}

GradSink Zero2Grads::sink(const ParamTensor& t) {
  const size_t ti = tensor_at(t.offset);
  if (resident_pos_[ti] >= 0) {
    const int64_t pos = resident_pos_[ti];
    return exact_ ? GradSink{nullptr, &resident_exact_, pos} : GradSink{resident_f32_.data() + pos, nullptr, 0};
  }
  const auto it = std::upper_bound(buckets_.begin(), buckets_.end(), t.offset,
                                   [](int64_t x, const GradBucket& b) { return x < b.end; });
  const auto b = static_cast<size_t>(it - buckets_.begin());
  LS_CHECK(it != buckets_.end() && t.offset + t.numel <= it->end, "tensor ", t.name, " is not inside one bucket");
  std::unique_lock<std::mutex> lock(mutex_);
  if (held_[b] == nullptr) {
    Buffer* buf = nullptr;
    allocate(lock, buf, it->size());
    held_[b] = buf;
    lock.unlock();
    if (exact_) {
      buf->exact.reset(static_cast<size_t>(it->size()));  // keeps the capacity: no allocation
    } else {
      std::fill_n(buf->f32.begin(), it->size(), 0.0f);
    }
  }
  Buffer* buf = held_[b];
  const int64_t pos = t.offset - it->first;
  return exact_ ? GradSink{nullptr, &buf->exact, pos} : GradSink{buf->f32.data() + pos, nullptr, 0};
}

void Zero2Grads::allocate(std::unique_lock<std::mutex>& lock, Buffer*& out, int64_t n) {
  for (;;) {
    // Best fit among the free buffers.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->capacity >= n && (best == free_.end() || (*it)->capacity < (*best)->capacity)) best = it;
    }
    if (best != free_.end()) {
      out = *best;
      free_.erase(best);
      return;
    }
    if (allocated_ + n > budget_ && closed_ > 0) {
      returned_.wait(lock);  // a reduction in flight will return its buffer
      continue;
    }
    // Nothing will come back: make room by dropping free buffers (another size), largest first.
    std::sort(free_.begin(), free_.end(), [](Buffer* a, Buffer* b) { return a->capacity < b->capacity; });
    while (allocated_ + n > budget_ && !free_.empty()) {
      Buffer* drop = free_.back();
      free_.pop_back();
      allocated_ -= drop->capacity;
      std::erase_if(buffers_, [drop](const std::unique_ptr<Buffer>& p) { return p.get() == drop; });
    }
    LS_REQUIRE(allocated_ + n <= budget_, "ZeRO-2 gradient staging: a bucket of ", n,
               " elements does not fit the staging budget of ", budget_, " elements while the backward holds ",
               allocated_, " elements in buckets it has not finished ([parallel] bucket_mb sets the bucket size)");
    auto buf = std::make_unique<Buffer>();
    buf->capacity = n;
    if (exact_) {
      buf->exact.reset(static_cast<size_t>(n));
    } else {
      buf->f32.assign(static_cast<size_t>(n), 0.0f);
    }
    allocated_ += n;
    allocated_peak_ = std::max(allocated_peak_, allocated_);
    out = buf.get();
    buffers_.push_back(std::move(buf));
    return;
  }
}

void Zero2Grads::close(size_t b) {
  if (resident_[b]) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (held_[b] == nullptr) {  // no tensor of it was written this micro-batch: a zero gradient
    Buffer* buf = nullptr;
    allocate(lock, buf, buckets_[b].size());
    held_[b] = buf;
    if (exact_) {
      buf->exact.reset(static_cast<size_t>(buckets_[b].size()));
    } else {
      std::fill_n(buf->f32.begin(), buckets_[b].size(), 0.0f);
    }
  }
  reducing_[b].push_back(held_[b]);
  held_[b] = nullptr;
  ++closed_;
}

GradSink Zero2Grads::staged(size_t b) const {
  if (resident_[b]) {
    const size_t ti = tensor_at(buckets_[b].first);
    const int64_t pos = resident_pos_[ti];
    return exact_ ? GradSink{nullptr, const_cast<ExactAccumulator*>(&resident_exact_), pos}
                  : GradSink{const_cast<float*>(resident_f32_.data()) + pos, nullptr, 0};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  LS_CHECK(!reducing_[b].empty(), "bucket ", b, " reduced before it was closed");
  Buffer* buf = reducing_[b].front();
  return exact_ ? GradSink{nullptr, &buf->exact, 0} : GradSink{buf->f32.data(), nullptr, 0};
}

void Zero2Grads::release(size_t b) {
  if (resident_[b]) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LS_CHECK(!reducing_[b].empty(), "bucket ", b, " released twice");
    free_.push_back(reducing_[b].front());
    reducing_[b].pop_front();
    --closed_;
  }
  returned_.notify_all();
}

void Zero2Grads::zero() {
  std::fill(shard_.begin(), shard_.end(), 0.0f);
  if (shard_exact_.size() > 0) shard_exact_.zero();
  std::fill(resident_f32_.begin(), resident_f32_.end(), 0.0f);
  if (resident_exact_.size() > 0) resident_exact_.zero();
}

void Zero2Grads::finish_shard() {
  if (shard_exact_.size() > 0) shard_exact_.round_to(shard_.data());
}

uint64_t Zero2Grads::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t resident = static_cast<uint64_t>(resident_elements_) * element_bytes();
  const uint64_t shard = shard_.size() * sizeof(float) + shard_exact_.size() * (sizeof(double) + 1);
  return shard + resident + static_cast<uint64_t>(allocated_peak_) * element_bytes();
}

}  // namespace lockstep::parallel
