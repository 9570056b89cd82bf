// Internal: what both attention kernels share (attention.cpp, attention_blocks.cpp): the shape
// check, a row's exp(s − m), one link of HS chains, fast mode's diagonal-block terms and its
// any-order dot product.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {

inline void check_shape(AttentionShape s, const char* op) {
  LS_REQUIRE(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, op,
             ": B, T, NH, NKV, HS must be positive (got B=", s.B, " T=", s.T, " NH=", s.NH,
             " NKV=", s.NKV, " HS=", s.HS, ")");
  LS_REQUIRE(s.NH % s.NKV == 0, op, ": NH (", s.NH, ") must be a multiple of NKV (", s.NKV, ")");
}

// e = exp(s − m) over a row's visible prefix (8 lanes, then the scalar tail: the same bits).
inline void exp_row(float* a, int64_t n, float m) {
  const int64_t nv = n / 8 * 8;
  for (int64_t u = 0; u < nv; u += 8) {
    _mm256_storeu_ps(a + u, simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(a + u), simd::set1(m))));
  }
  for (int64_t u = nv; u < n; ++u) a[u] = ls_expf(a[u] - m);
}

// One link of HS chains: acc[d] = fma(w, x[d], acc[d]).
inline void fma_link(float* acc, float w, const float* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) acc[d] = std::fma(w, x[d], acc[d]);
}

// y[d] += Σ_{i < count} w[i·sw]·x[i·sx + d] for d < n: the diagonal-block terms of the fast
// products, in increasing i, one FMA per term (half the operations of a multiply and an add; the
// fast bound holds with or without FMA). The running sums of up to 64 columns stay in registers
// across the terms (a store and reload of y per term made the loop wait on store forwarding).
inline void add_weighted_rows(float* y, const float* w, int64_t sw, const float* x, int64_t sx, int64_t count,
                              int64_t n) {
  constexpr int kVectors = 8;
  int64_t d = 0;
  for (; d + 8 * kVectors <= n; d += 8 * kVectors) {
    __m256 acc[kVectors];
    for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_loadu_ps(y + d + 8 * v);
    for (int64_t i = 0; i < count; ++i) {
      const __m256 wv = _mm256_set1_ps(w[i * sw]);
      const float* xi = x + i * sx + d;
      for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xi + 8 * v), acc[v]);
    }
    for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(y + d + 8 * v, acc[v]);
  }
  for (; d + 8 <= n; d += 8) {
    __m256 acc = _mm256_loadu_ps(y + d);
    for (int64_t i = 0; i < count; ++i) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[i * sw]), _mm256_loadu_ps(x + i * sx + d), acc);
    }
    _mm256_storeu_ps(y + d, acc);
  }
  for (; d < n; ++d) {
    float acc = y[d];
    for (int64_t i = 0; i < count; ++i) acc = std::fma(w[i * sw], x[i * sx + d], acc);
    y[d] = acc;
  }
}

// Σ_{u < n} x[u]·y[u] in 8 lanes of FMA chains, then the lanes: an order of its own, which the
// fast bound (γ_n·Σ|x·y|, any order, with or without FMA) covers; one scalar chain would wait on
// every addition.
inline float dot_any_order(const float* x, const float* y, int64_t n) {
  const int64_t nv = n / 8 * 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t u = 0; u < nv; u += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + u), _mm256_loadu_ps(y + u), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (int64_t u = nv; u < n; ++u) sum = std::fma(x[u], y[u], sum);
  return sum;
}

}  // namespace lockstep::cpu
