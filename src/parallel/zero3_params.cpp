// ZeRO-3 parameter memory (see zero3_params.hpp).
#include "src/parallel/zero3_params.hpp"

#include <algorithm>
#include <bit>
#include <chrono>

#include "src/core/check.hpp"

namespace lockstep::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Elements of the shard rounded at a time (Zero3Params::rounded_).
constexpr size_t kRoundingBlock = size_t{1} << 16;

}  // namespace

Zero3Params::Zero3Params(Model& model, comm::Communicator& dp, const ShardPlan& plan, bool threaded)
    : model_(model), comm_(dp.split(0, dp.rank(), dp.name())), plan_(plan), first_(plan.first(dp.rank())),
      shard_(static_cast<size_t>(plan.size(dp.rank())), 0.0f) {
  int64_t largest = 0, largest_bf16 = 0;
  for (size_t l = 0; l < model_.num_layers(); ++l) {
    const std::vector<const ParamTensor*>& tensors = model_.layer_params(l);
    const std::vector<const ParamTensor*>& rounded = model_.layer_bf16_weights(l);
    std::vector<const ParamTensor*> sorted = tensors;
    std::sort(sorted.begin(), sorted.end(), [](const ParamTensor* a, const ParamTensor* b) { return a->offset < b->offset; });
    LayerGather g;
    int64_t at = 0;
    for (const ParamTensor* t : sorted) {
      const bool bf16 = model_.bf16_params() || std::find(rounded.begin(), rounded.end(), t) != rounded.end();
      if (!g.runs.empty() && g.runs.back().end == t->offset && g.runs.back().bf16 == bf16) {
        g.runs.back().end += t->numel;
      } else {
        g.runs.push_back({t->offset, t->offset + t->numel, at, bf16});
      }
      at += t->numel;
    }
    for (const Run& r : g.runs) {
      if (r.bf16) largest_bf16 = std::max(largest_bf16, r.end - r.first);
    }
    for (const ParamTensor* t : tensors) {
      const auto run = std::find_if(g.runs.begin(), g.runs.end(),
                                    [&](const Run& r) { return t->offset >= r.first && t->offset < r.end; });
      g.at.push_back(run->at + (t->offset - run->first));
    }
    largest = std::max(largest, at);
    layers_.push_back(std::move(g));
  }
  for (Window& w : windows_) w.data.resize(static_cast<size_t>(largest));
  bf16_.resize(static_cast<size_t>(largest_bf16));
  if (largest_bf16 > 0) {
    shard_bf16_.resize(shard_.size());
    rounded_.resize(std::min<size_t>(shard_.size(), kRoundingBlock));
  }
  model_.set_param_storage(this);
  if (threaded) worker_ = std::thread([this] { run_worker(); });
}

Zero3Params::~Zero3Params() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  model_.set_param_storage(nullptr);
}

void Zero3Params::fill(Window& w, size_t layer) {
  const LayerGather& g = layers_[layer];
  for (const Run& r : g.runs) {
    const ShardPlan part = plan_.window(r.first, r.end);
    const int me = comm_->rank();
    // This rank's part of the run, from its shard (MPI may not send from the receive buffer).
    const int64_t from = std::clamp(r.first + part.first(me) - first_, int64_t{0}, static_cast<int64_t>(shard_.size()));
    float* out = w.data.data() + r.at;
    if (!r.bf16) {
      comm_->all_gatherv(shard_.data() + from, out, part.sizes(), part.firsts(), DType::kF32);
      continue;
    }
    // Rounded by its owner, sent as bf16, widened here: the bits the model's own rounding of the
    // gathered fp32 weight would give, for half the bytes. Widening a bf16 value is a shift of its
    // bits (the rounding quiets NaNs, so no signalling one needs its quiet bit set).
    comm_->all_gatherv(shard_bf16_.data() + from, bf16_.data(), part.sizes(), part.firsts(), DType::kU16);
    const int64_t n = r.end - r.first;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{bf16_[static_cast<size_t>(i)]} << 16);
  }
  w.where.clear();
  for (int64_t at : g.at) w.where.push_back(w.data.data() + at);
}

void Zero3Params::assign(Window& w, size_t layer) {
  w.layer = layer;
  if (!worker_.joinable()) {
    const auto t0 = Clock::now();
    fill(w, layer);
    const double dt = seconds_since(t0);
    comm_s_ += dt;
    exposed_s_ += dt;
    ++gathers_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    w.ready = false;
    job_ = &w;
  }
  cv_.notify_all();
}

void Zero3Params::wait_ready(Window& w) {
  if (!worker_.joinable()) return;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return w.ready || error_ != nullptr; });
  exposed_s_ += seconds_since(t0);
  if (error_) std::rethrow_exception(error_);
}

void Zero3Params::run_worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;
    Window& w = *job_;
    lock.unlock();
    const auto t0 = Clock::now();
    std::exception_ptr error;
    try {
      fill(w, w.layer);
    } catch (...) {
      error = std::current_exception();
    }
    const double dt = seconds_since(t0);
    lock.lock();
    comm_s_ += dt;
    ++gathers_;
    job_ = nullptr;
    w.ready = true;
    if (error && !error_) error_ = error;
    cv_.notify_all();
  }
}

std::span<float* const> Zero3Params::gather(size_t layer, size_t next) {
  LS_CHECK(layer < layers_.size(), "layer ", layer, " of ", layers_.size());
  const auto holding = [&](size_t l) -> Window* {
    for (Window& w : windows_)
      if (w.layer == l) return &w;
    return nullptr;
  };
  Window* w = holding(layer);
  if (w == nullptr) {
    // The window the model does not read now; a prefetch into it that guessed wrong ends first.
    w = &windows_[1 - current_];
    wait_ready(*w);
    assign(*w, layer);
  }
  wait_ready(*w);
  current_ = static_cast<size_t>(w - windows_);
  if (next < layers_.size() && holding(next) == nullptr) {
    Window& other = windows_[1 - current_];
    wait_ready(other);
    assign(other, next);
  }
  return w->where;
}

void Zero3Params::invalidate() {
  for (Window& w : windows_) {
    wait_ready(w);
    w.layer = SIZE_MAX;
  }
  for (size_t first = 0; first < shard_bf16_.size(); first += rounded_.size()) {
    const size_t n = std::min(rounded_.size(), shard_bf16_.size() - first);
    model_.backend().round_to_bf16(static_cast<int64_t>(n), rounded_.data(), shard_.data() + first);
#pragma omp simd
    for (size_t i = 0; i < n; ++i) shard_bf16_[first + i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(rounded_[i]) >> 16);
  }
}

void Zero3Params::hold_whole() {
  invalidate();
  model_.hold_params(true);
  comm_->all_gatherv(shard_.data(), model_.params(), plan_.sizes(), plan_.firsts(), DType::kF32);
}

void Zero3Params::release_whole() {
  const float* whole = model_.params();
  std::copy(whole + first_, whole + shard_end(), shard_.begin());
  model_.hold_params(false);
  invalidate();
}

uint64_t Zero3Params::bytes() const {
  return (shard_.size() + windows_[0].data.size() + windows_[1].data.size() + rounded_.size()) * sizeof(float) +
         (shard_bf16_.size() + bf16_.size()) * sizeof(uint16_t);
}

OverlapStats Zero3Params::take_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  OverlapStats s{gathers_, comm_s_, exposed_s_};
  gathers_ = 0;
  comm_s_ = exposed_s_ = 0;
  return s;
}

void Zero3Params::absorb_into(comm::Communicator& dp) { dp.absorb_stats(*comm_); }

}  // namespace lockstep::parallel
