// LayerNorm and RMSNorm on the CPU, forward and backward, canonical and fast modes.
//
// Row statistics follow kernels/ops/norm.hpp: canonical mode reduces each row with the chunked
// chains of canonical.hpp (computed on the fly, bitwise equal to canonical_sum / canonical_dot of
// the materialised terms), eight rows' chains side by side in the lanes of a vector where C is a
// multiple of 8 (row_chains8); fast mode reduces with `omp simd` (any order, within the
// reference's order-free bounds). Every elementwise expression is the same in both modes and uses
// no FMA outside the chains. Threads split groups of eight rows (statistics, outputs, dinp) or
// columns (dweight, dbias), never a reduction.
//
// Not here: the reference (reference/norm.hpp), fused residual+norm variants.
#include "kernels/ops/norm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/bf16_bits.hpp"
#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/token_reduction.hpp"
#include "kernels/ops/canonical.hpp"

namespace lockstep::cpu {
namespace {

// Σ link-chain over i in [0, n): canonical chunks (chain from +0.0f per chunk, exact combination,
// one rounding) or, in fast mode, one vectorised sum of `term(i)` in any order. `link(acc, i)`
// is the canonical chain step; `term(i)` the same summand for the fast path.
template <class Link, class Term>
float row_reduce(Mode mode, int64_t n, Link link, Term term) {
  if (mode == Mode::kCanonical) {
    ChunkCombiner comb;
    for (int64_t i0 = 0; i0 < n; i0 += kCanonicalChunk) {
      const int64_t i1 = i0 + kCanonicalChunk < n ? i0 + kCanonicalChunk : n;
      float acc = 0.0f;
      for (int64_t i = i0; i < i1; ++i) acc = link(acc, i);
      comb.add(acc);
    }
    return comb.finish();
  }
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += term(i);
  return acc;
}

// Rows are processed in groups of this many: with C % 8 == 0, a whole group's canonical row
// reductions run as row_chains8.
constexpr int64_t kRowGroup = 8;

// out[j] = the canonical reduction of row j (j < 8; C a multiple of 8): per chunk of 64 columns,
// the eight rows' chains advance side by side, one per lane, `acc = block(acc, i)` performing the
// links of columns i .. i + 7 in order (reading the rows through simd::load_transposed8); chunk
// partials combined exactly, one rounding. Each lane performs its row's chain of row_reduce.
template <class Block>
void row_chains8(int64_t C, float* out, Block block) {
  ChunkCombiner comb[kRowGroup];
  alignas(32) float lane[kRowGroup];
  for (int64_t i0 = 0; i0 < C; i0 += kCanonicalChunk) {
    const int64_t i1 = std::min(i0 + kCanonicalChunk, C);
    simd::V8 acc = _mm256_setzero_ps();
    for (int64_t i = i0; i < i1; i += 8) acc = block(acc, i);
    _mm256_store_ps(lane, acc);
    for (int j = 0; j < kRowGroup; ++j) comb[j].add(lane[j]);
  }
  for (int j = 0; j < kRowGroup; ++j) out[j] = comb[j].finish();
}

// row_chains8 over the eight rows of x (row stride C): acc = link(acc, v) per column, v holding the
// rows' values at that column (lane j: row j).
template <class Link>
void row_chains8_of(int64_t C, const float* x, float* out, Link link) {
  row_chains8(C, out, [&](simd::V8 acc, int64_t i) {
    simd::V8 r[8];
    simd::load_transposed8(x + i, C, r);
    for (const simd::V8& v : r) acc = link(acc, v);
    return acc;
  });
}

// The backward's Σ fma(w·dout, xhat, acc) over the eight rows of dy and x (row stride C), lane j
// row j's: w·dout rounded, xhat = xhat_of(x) as the norm defines it.
template <class XhatOf>
void wd_xhat_chains8(int64_t C, const float* weight, const float* dy, const float* x, float* out, XhatOf xhat_of) {
  row_chains8(C, out, [&](simd::V8 acc, int64_t i) {
    simd::V8 d[8], xr[8];
    simd::load_transposed8(dy + i, C, d);
    simd::load_transposed8(x + i, C, xr);
    for (int k = 0; k < 8; ++k) {
      acc = _mm256_fmadd_ps(_mm256_mul_ps(simd::set1(weight[i + k]), d[k]), xhat_of(xr[k]), acc);
    }
    return acc;
  });
}

// A row of the forward's output rounded to bf16 while it is in cache (NormShape::round_bf16).
void round_row(int64_t C, float* o) {
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) o[i] = bf16_nearest(o[i]);
}

// Whether rows [n0, n0 + 8) take row_chains8.
bool whole_group(Mode mode, NormShape s, int64_t n0) {
  return mode == Mode::kCanonical && s.C % 8 == 0 && n0 + kRowGroup <= s.N;
}

void check_shape(NormShape s, const char* op) {
  LS_REQUIRE(s.N >= 0 && s.C > 0, op, ": need N >= 0 and C > 0, got N=", s.N, " C=", s.C);
  LS_REQUIRE(s.C < (int64_t{1} << 24), op, ": C (", s.C, ") must be below 2^24 so that it is ",
             "exact in fp32");
}

}  // namespace

void layernorm_forward(Mode mode, NormShape s, float* out, float* mean, float* rstd,
                       const float* inp, const float* weight, const float* bias) {
  check_shape(s, "layernorm_forward");
  const int64_t C = s.C;
  const float fC = static_cast<float>(C);
  const int64_t groups = (s.N + kRowGroup - 1) / kRowGroup;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * kRowGroup, rows = std::min(kRowGroup, s.N - n0);
    alignas(32) float m[kRowGroup], var[kRowGroup];
    if (whole_group(mode, s, n0)) {
      const float* x = inp + n0 * C;
      // mean = Σx/C
      row_chains8_of(C, x, m, [](simd::V8 acc, simd::V8 v) { return _mm256_add_ps(acc, v); });
      for (float& v : m) v = v / fC;
      // var = Σ(x-mean)²/C: d = x - m, fma(d, d, acc), lane j's mean in lane j
      const simd::V8 mv = _mm256_load_ps(m);
      row_chains8_of(C, x, var, [&](simd::V8 acc, simd::V8 v) {
        const simd::V8 d = _mm256_sub_ps(v, mv);
        return _mm256_fmadd_ps(d, d, acc);
      });
      for (float& v : var) v = v / fC;
    } else {
      for (int64_t j = 0; j < rows; ++j) {
        const float* x = inp + (n0 + j) * C;
        m[j] = row_reduce(
            mode, C, [&](float acc, int64_t i) { return acc + x[i]; },
            [&](int64_t i) { return x[i]; }) / fC;
        // second pass over the centred values (canonical_dot(d, d), d = x - m)
        const float mj = m[j];
        var[j] = row_reduce(
            mode, C,
            [&](float acc, int64_t i) {
              const float d = x[i] - mj;
              return std::fma(d, d, acc);
            },
            [&](int64_t i) {
              const float d = x[i] - mj;
              return d * d;
            }) / fC;
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t n = n0 + j;
      const float* x = inp + n * C;
      // rstd = 1/sqrt(var + eps): three roundings (add, IEEE sqrt, IEEE divide)
      const float r = 1.0f / std::sqrt(var[j] + s.eps);
      const float mj = m[j];
      float* o = out + n * C;
      for (int64_t i = 0; i < C; ++i) o[i] = ((x[i] - mj) * r) * weight[i] + bias[i];
      if (s.round_bf16) round_row(C, o);
      mean[n] = mj;
      rstd[n] = r;
    }
  }
}

void layernorm_backward(Mode mode, NormShape s, int64_t token_offset, float* dinp,
                        GradSink dweight, GradSink dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd) {
  check_shape(s, "layernorm_backward");
  detail::require_token_offset(mode, token_offset, "layernorm_backward");
  detail::check_grad_sink(mode, dweight, s.C, "layernorm_backward dweight");
  detail::check_grad_sink(mode, dbias, s.C, "layernorm_backward dbias");
  const int64_t C = s.C;
  const float fC = static_cast<float>(C);

  // Forward: o = ((x - m) * r) * w + b, with xhat = (x - m) * r and wd = w * dout:
  //   dinp += r * ((wd - mean(wd)) - xhat * mean(wd * xhat))
  // mean(wd) = canonical_sum(wd)/C; mean(wd * xhat) = canonical_dot(wd, xhat)/C.
  const int64_t groups = (s.N + kRowGroup - 1) / kRowGroup;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * kRowGroup, rows = std::min(kRowGroup, s.N - n0);
    alignas(32) float mean_wd[kRowGroup], mean_wdx[kRowGroup];
    if (whole_group(mode, s, n0)) {
      const float* x = inp + n0 * C;
      const float* dy = dout + n0 * C;
      // Σ w·dout: the product rounded, then added (lane j: row j's dout, the same w[i])
      row_chains8(C, mean_wd, [&](simd::V8 acc, int64_t i) {
        simd::V8 d[8];
        simd::load_transposed8(dy + i, C, d);
        for (int k = 0; k < 8; ++k) acc = _mm256_add_ps(acc, _mm256_mul_ps(simd::set1(weight[i + k]), d[k]));
        return acc;
      });
      // Σ fma(w·dout, (x - m)·r, acc), lane j's m and r in lane j
      const simd::V8 mv = _mm256_setr_ps(mean[n0], mean[n0 + 1], mean[n0 + 2], mean[n0 + 3], mean[n0 + 4],
                                         mean[n0 + 5], mean[n0 + 6], mean[n0 + 7]);
      const simd::V8 rv = _mm256_loadu_ps(rstd + n0);
      wd_xhat_chains8(C, weight, dy, x, mean_wdx,
                      [&](simd::V8 xv) { return _mm256_mul_ps(_mm256_sub_ps(xv, mv), rv); });
      for (int j = 0; j < kRowGroup; ++j) {
        mean_wd[j] = mean_wd[j] / fC;
        mean_wdx[j] = mean_wdx[j] / fC;
      }
    } else {
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t n = n0 + j;
        const float* x = inp + n * C;
        const float* dy = dout + n * C;
        const float m = mean[n], r = rstd[n];
        mean_wd[j] = row_reduce(
            mode, C, [&](float acc, int64_t i) { return acc + weight[i] * dy[i]; },
            [&](int64_t i) { return weight[i] * dy[i]; }) / fC;
        mean_wdx[j] = row_reduce(
            mode, C,
            [&](float acc, int64_t i) { return std::fma(weight[i] * dy[i], (x[i] - m) * r, acc); },
            [&](int64_t i) { return (weight[i] * dy[i]) * ((x[i] - m) * r); }) / fC;
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t n = n0 + j;
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], r = rstd[n], mwd = mean_wd[j], mwdx = mean_wdx[j];
      float* dx = dinp + n * C;
      for (int64_t i = 0; i < C; ++i) {
        const float xhat = (x[i] - m) * r;
        const float wd = weight[i] * dy[i];
        dx[i] += r * ((wd - mwd) - xhat * mwdx);
      }
    }
  }
  // dweight[c] += Σ_n dout·xhat (FMA chain), dbias[c] += Σ_n dout (plain-add chain).
  detail::reduce_columns_over_tokens(mode, s.N, C, dweight, [&](float acc, int64_t n, int64_t c) {
    return std::fma(dout[n * C + c], (inp[n * C + c] - mean[n]) * rstd[n], acc);
  });
  detail::reduce_columns_over_tokens(mode, s.N, C, dbias, [&](float acc, int64_t n, int64_t c) {
    return acc + dout[n * C + c];
  });
}

void rmsnorm_forward(Mode mode, NormShape s, float* out, float* rstd, const float* inp,
                     const float* weight) {
  check_shape(s, "rmsnorm_forward");
  const int64_t C = s.C;
  const float fC = static_cast<float>(C);
  const int64_t groups = (s.N + kRowGroup - 1) / kRowGroup;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * kRowGroup, rows = std::min(kRowGroup, s.N - n0);
    // Σx²/C, Σx² = canonical_dot(x, x)
    alignas(32) float ms[kRowGroup];
    if (whole_group(mode, s, n0)) {
      const float* x = inp + n0 * C;
      row_chains8_of(C, x, ms, [](simd::V8 acc, simd::V8 v) { return _mm256_fmadd_ps(v, v, acc); });
      for (float& v : ms) v = v / fC;
    } else {
      for (int64_t j = 0; j < rows; ++j) {
        const float* x = inp + (n0 + j) * C;
        ms[j] = row_reduce(
            mode, C, [&](float acc, int64_t i) { return std::fma(x[i], x[i], acc); },
            [&](int64_t i) { return x[i] * x[i]; }) / fC;
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t n = n0 + j;
      const float* x = inp + n * C;
      // rstd = 1/sqrt(Σx²/C + eps)
      const float r = 1.0f / std::sqrt(ms[j] + s.eps);
      float* o = out + n * C;
      for (int64_t i = 0; i < C; ++i) o[i] = (x[i] * r) * weight[i];
      if (s.round_bf16) round_row(C, o);
      rstd[n] = r;
    }
  }
}

void rmsnorm_backward(Mode mode, NormShape s, int64_t token_offset, float* dinp,
                      GradSink dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd) {
  check_shape(s, "rmsnorm_backward");
  detail::require_token_offset(mode, token_offset, "rmsnorm_backward");
  detail::check_grad_sink(mode, dweight, s.C, "rmsnorm_backward dweight");
  const int64_t C = s.C;
  const float fC = static_cast<float>(C);

  // Forward: o = (x * r) * w, with xhat = x * r and wd = w * dout:
  //   dinp += r * (wd - xhat * mean(wd * xhat)),  mean(wd * xhat) = canonical_dot(wd, xhat)/C.
  const int64_t groups = (s.N + kRowGroup - 1) / kRowGroup;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * kRowGroup, rows = std::min(kRowGroup, s.N - n0);
    alignas(32) float mean_wdx[kRowGroup];
    if (whole_group(mode, s, n0)) {
      const float* x = inp + n0 * C;
      const float* dy = dout + n0 * C;
      // Σ fma(w·dout, x·r, acc), lane j's r in lane j
      const simd::V8 rv = _mm256_loadu_ps(rstd + n0);
      wd_xhat_chains8(C, weight, dy, x, mean_wdx, [&](simd::V8 xv) { return _mm256_mul_ps(xv, rv); });
      for (float& v : mean_wdx) v = v / fC;
    } else {
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t n = n0 + j;
        const float* x = inp + n * C;
        const float* dy = dout + n * C;
        const float r = rstd[n];
        mean_wdx[j] = row_reduce(
            mode, C, [&](float acc, int64_t i) { return std::fma(weight[i] * dy[i], x[i] * r, acc); },
            [&](int64_t i) { return (weight[i] * dy[i]) * (x[i] * r); }) / fC;
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t n = n0 + j;
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float r = rstd[n], mwdx = mean_wdx[j];
      float* dx = dinp + n * C;
      for (int64_t i = 0; i < C; ++i) {
        const float xhat = x[i] * r;
        const float wd = weight[i] * dy[i];
        dx[i] += r * (wd - xhat * mwdx);
      }
    }
  }
  // dweight[c] += Σ_n dout·xhat (FMA chain).
  detail::reduce_columns_over_tokens(mode, s.N, C, dweight, [&](float acc, int64_t n, int64_t c) {
    return std::fma(dout[n * C + c], inp[n * C + c] * rstd[n], acc);
  });
}

}  // namespace lockstep::cpu
