// CanonicalF32: an exact emulation of canonical-mode fp32 as a reference scalar type.
//
// Every arithmetic operation rounds to fp32 (round-to-nearest-even, no contraction: the build uses
// -ffp-contract=off), sqrt is IEEE's, exp/log/tanh are the project's own ls_expf/ls_logf/ls_tanhf,
// and the reductions reference::sum / dot / dot_at / sum_at and the parameter-gradient sinks follow
// kernels/ops/canonical.hpp literally: chunks of 64 indices counted from the start of the global
// range, one fp32 chain per chunk from +0.0f (FMA links for products, plain adds for sums), chunk
// partials combined exactly and rounded once. The templated reference ops and reference/gpt.hpp
// instantiated with this type must therefore equal canonical-mode kernels bit for bit.
//
// Dependencies, on purpose: kernels/ops/canonical.hpp (the executable contract; its ChunkCombiner
// and, through it, src/core/exact_sum.hpp's ExactAccumulator provide the exact combination),
// kernels/ops/fp8_accumulation.hpp (the executable model of the Hopper FP8 accumulator) and
// kernels/ops/transcendental.hpp (the canonical exp/log/tanh). Nothing else of kernels/ or src/.
// Not here: the bf16 rounding (reference/cast.hpp), fp16/fp8 emulation, fast mode (checked with
// Bounded<T>, not emulated).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/fp8_accumulation.hpp"
#include "kernels/ops/transcendental.hpp"
#include "reference/fp8_accumulation.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

struct CanonicalF32 {
  float v = 0.0f;

  CanonicalF32() = default;
  CanonicalF32(float x) : v(x) {}                           // NOLINT: exact
  CanonicalF32(double x) : v(static_cast<float>(x)) {}      // NOLINT: one RNE rounding
  CanonicalF32(int x) : v(static_cast<float>(x)) {}         // NOLINT: small integers, exact

  friend CanonicalF32 operator+(CanonicalF32 a, CanonicalF32 b) { return a.v + b.v; }
  friend CanonicalF32 operator-(CanonicalF32 a, CanonicalF32 b) { return a.v - b.v; }
  friend CanonicalF32 operator*(CanonicalF32 a, CanonicalF32 b) { return a.v * b.v; }
  friend CanonicalF32 operator/(CanonicalF32 a, CanonicalF32 b) { return a.v / b.v; }
  friend CanonicalF32 operator-(CanonicalF32 a) { return -a.v; }
  CanonicalF32& operator+=(CanonicalF32 o) { v = v + o.v; return *this; }
  CanonicalF32& operator-=(CanonicalF32 o) { v = v - o.v; return *this; }
  CanonicalF32& operator*=(CanonicalF32 o) { v = v * o.v; return *this; }
  CanonicalF32& operator/=(CanonicalF32 o) { v = v / o.v; return *this; }
  friend bool operator<(CanonicalF32 a, CanonicalF32 b) { return a.v < b.v; }
  friend bool operator>(CanonicalF32 a, CanonicalF32 b) { return a.v > b.v; }
  friend bool operator<=(CanonicalF32 a, CanonicalF32 b) { return a.v <= b.v; }
  friend bool operator>=(CanonicalF32 a, CanonicalF32 b) { return a.v >= b.v; }
  friend bool operator==(CanonicalF32 a, CanonicalF32 b) { return a.v == b.v; }
  explicit operator double() const { return v; }
};

inline CanonicalF32 sqrt(CanonicalF32 a) { return std::sqrt(a.v); }
inline CanonicalF32 abs(CanonicalF32 a) { return std::fabs(a.v); }
inline CanonicalF32 exp(CanonicalF32 a) { return ls_expf(a.v); }
inline CanonicalF32 log(CanonicalF32 a) { return ls_logf(a.v); }
inline CanonicalF32 tanh(CanonicalF32 a) { return ls_tanhf(a.v); }
inline CanonicalF32 fma(CanonicalF32 a, CanonicalF32 b, CanonicalF32 c) {
  return std::fma(a.v, b.v, c.v);
}

// ---- canonical reductions (kernels/ops/canonical.hpp) ----

namespace canonical_detail {

// Feeds the chunk partials of Σ terms over global positions pos[0..n) (increasing) to `emit`:
// a new chain from +0.0f whenever ⌊pos/64⌋ changes; `link(acc, i)` is one link of the chain.
// A chunk holding no term emits nothing (the same as the +0 partial of an empty chain, which
// never changes an exact sum that starts at +0).
template <class Pos, class Link, class Emit>
void chunked_chains(int64_t n, Pos pos, Link link, Emit emit) {
  int64_t chunk = -1;
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = pos(i) / kCanonicalChunk;
    if (c != chunk) {
      if (chunk >= 0) emit(acc);
      chunk = c;
      acc = 0.0f;
    }
    acc = link(acc, i);
  }
  if (chunk >= 0) emit(acc);
}

inline int64_t identity(int64_t i) { return i; }

}  // namespace canonical_detail

// Σ x[i·stride], i in [0, n): canonical_sum.
inline CanonicalF32 sum(const CanonicalF32* x, int64_t stride, int64_t n) {
  ChunkCombiner c;
  canonical_detail::chunked_chains(
      n, canonical_detail::identity, [&](float acc, int64_t i) { return acc + x[i * stride].v; },
      [&](float p) { c.add(p); });
  return c.finish();
}

// Σ a[i·sa]·b[i·sb]: canonical_dot.
inline CanonicalF32 dot(const CanonicalF32* a, int64_t sa, const CanonicalF32* b, int64_t sb,
                        int64_t n) {
  ChunkCombiner c;
  canonical_detail::chunked_chains(
      n, canonical_detail::identity,
      [&](float acc, int64_t i) { return std::fma(a[i * sa].v, b[i * sb].v, acc); },
      [&](float p) { c.add(p); });
  return c.finish();
}

// Gathered terms at global positions pos[i] (increasing): chunks by ⌊pos/64⌋.
inline CanonicalF32 dot_at(const int64_t* pos, const CanonicalF32* a, const CanonicalF32* b,
                           int64_t n) {
  ChunkCombiner c;
  canonical_detail::chunked_chains(
      n, [&](int64_t i) { return pos[i]; },
      [&](float acc, int64_t i) { return std::fma(a[i].v, b[i].v, acc); },
      [&](float p) { c.add(p); });
  return c.finish();
}
inline CanonicalF32 sum_at(const int64_t* pos, const CanonicalF32* x, int64_t n) {
  ChunkCombiner c;
  canonical_detail::chunked_chains(
      n, [&](int64_t i) { return pos[i]; }, [&](float acc, int64_t i) { return acc + x[i].v; },
      [&](float p) { c.add(p); });
  return c.finish();
}

// Sums whose chunking restarts at every segment boundary (bounds = {0, b1, ..., n}), all chunk
// partials combined exactly, one rounding: the trainer's loss over micro-batches (the head layer
// adds each micro-batch's losses) and the gradient norm over tensors (grad_sumsq_accumulate).
inline CanonicalF32 sum_segments(const CanonicalF32* x, const std::vector<int64_t>& bounds) {
  ChunkCombiner c;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const CanonicalF32* xs = x + bounds[s];
    canonical_detail::chunked_chains(
        bounds[s + 1] - bounds[s], canonical_detail::identity,
        [&](float acc, int64_t i) { return acc + xs[i].v; }, [&](float p) { c.add(p); });
  }
  return c.finish();
}
inline CanonicalF32 sumsq_segments(const CanonicalF32* x, const std::vector<int64_t>& bounds) {
  ChunkCombiner c;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const CanonicalF32* xs = x + bounds[s];
    canonical_detail::chunked_chains(
        bounds[s + 1] - bounds[s], canonical_detail::identity,
        [&](float acc, int64_t i) { return std::fma(xs[i].v, xs[i].v, acc); },
        [&](float p) { c.add(p); });
  }
  return c.finish();
}

// ---- parameter gradients: exact accumulation of token-chunk partials (GradSink::exact) ----

// With `exact` set, token reductions add each chunk partial to element offset + i of the exact
// accumulator (as the kernels do with GradSink::exact) and GradStore::finish rounds once; without
// it, they round per call and add into `data` (per-op tests).
template <>
struct GradOut<CanonicalF32> {
  CanonicalF32* data = nullptr;
  ExactAccumulator* exact = nullptr;
  int64_t offset = 0;

  GradOut() = default;
  GradOut(CanonicalF32* p) : data(p) {}  // NOLINT: plain buffers convert implicitly
  GradOut(CanonicalF32* p, ExactAccumulator* e, int64_t off) : data(p), exact(e), offset(off) {}
  explicit operator bool() const { return data != nullptr || exact != nullptr; }
};

inline void grad_dot(GradOut<CanonicalF32> g, int64_t i, const CanonicalF32* a, int64_t sa,
                     const CanonicalF32* b, int64_t sb, int64_t n) {
  if (g.exact == nullptr) {
    g.data[i] += dot(a, sa, b, sb, n);
    return;
  }
  canonical_detail::chunked_chains(
      n, canonical_detail::identity,
      [&](float acc, int64_t k) { return std::fma(a[k * sa].v, b[k * sb].v, acc); },
      [&](float p) { g.exact->add(static_cast<size_t>(g.offset + i), p); });
}

inline void grad_sum(GradOut<CanonicalF32> g, int64_t i, const CanonicalF32* x, int64_t sx,
                     int64_t n) {
  if (g.exact == nullptr) {
    g.data[i] += sum(x, sx, n);
    return;
  }
  canonical_detail::chunked_chains(
      n, canonical_detail::identity, [&](float acc, int64_t k) { return acc + x[k * sx].v; },
      [&](float p) { g.exact->add(static_cast<size_t>(g.offset + i), p); });
}

inline void grad_sum_at(GradOut<CanonicalF32> g, int64_t i, const int64_t* pos,
                        const CanonicalF32* x, int64_t n) {
  if (g.exact == nullptr) {
    g.data[i] += sum_at(pos, x, n);
    return;
  }
  canonical_detail::chunked_chains(
      n, [&](int64_t k) { return pos[k]; }, [&](float acc, int64_t k) { return acc + x[k].v; },
      [&](float p) { g.exact->add(static_cast<size_t>(g.offset + i), p); });
}

// ---- FP8 GEMM accumulation (reference/fp8_accumulation.hpp) ----

namespace canonical_detail {
inline std::vector<float> floats(const CanonicalF32* x, int64_t stride, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = x[i * stride].v;
  return out;
}
}  // namespace canonical_detail

inline CanonicalF32 dot_accumulated(Accumulation acc, const CanonicalF32* a, int64_t sa, const CanonicalF32* b,
                                    int64_t sb, int64_t n) {
  if (acc == Accumulation::kFp32) return dot(a, sa, b, sb, n);
  const std::vector<float> x = canonical_detail::floats(a, sa, n), y = canonical_detail::floats(b, sb, n);
  return fp8_hopper_dot(Mode::kCanonical, x.data(), 1, y.data(), 1, n);
}

// Under kHopperFp8 the partials are the promotion intervals' (of 128 tokens).
inline void grad_dot_accumulated(Accumulation acc, GradOut<CanonicalF32> g, int64_t i, const CanonicalF32* a,
                                 int64_t sa, const CanonicalF32* b, int64_t sb, int64_t n) {
  if (acc == Accumulation::kFp32) return grad_dot(g, i, a, sa, b, sb, n);
  if (g.exact == nullptr) {
    g.data[i] += dot_accumulated(acc, a, sa, b, sb, n);
    return;
  }
  const std::vector<float> x = canonical_detail::floats(a, sa, n), y = canonical_detail::floats(b, sb, n);
  for (int64_t k0 = 0; k0 < n; k0 += kFp8PromotionInterval) {
    const int64_t len = std::min(kFp8PromotionInterval, n - k0);
    g.exact->add(static_cast<size_t>(g.offset + i),
                 static_cast<float>(fp8_limited_interval(x.data() + k0, 1, y.data() + k0, 1, len)));
  }
}

// The model's parameter gradients: one exact running sum per element, rounded once by finish()
// (Model::finish_grads).
template <>
struct GradStore<CanonicalF32> {
  std::vector<CanonicalF32> g;
  ExactAccumulator exact;

  void reset(int64_t n) {
    g.assign(static_cast<size_t>(n), CanonicalF32(0.0f));
    exact.reset(static_cast<size_t>(n));
  }
  GradOut<CanonicalF32> out(int64_t offset) { return {nullptr, &exact, offset}; }
  void finish() {
    for (size_t i = 0; i < g.size(); ++i) g[i] = exact.round(i);
  }
};

}  // namespace lockstep::reference
