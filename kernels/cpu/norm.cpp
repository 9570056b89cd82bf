// LayerNorm and RMSNorm on the CPU, forward and backward, canonical and fast modes.
//
// Row statistics follow kernels/ops/norm.hpp: canonical mode reduces each row with the chunked
// chains of canonical.hpp (computed on the fly, bitwise equal to canonical_sum / canonical_dot of
// the materialised terms); fast mode reduces with `omp simd` (any order, within the reference's
// order-free bounds). Every elementwise expression is the same in both modes and uses no FMA.
// Threads split rows (statistics, outputs, dinp) or columns (dweight, dbias), never a reduction.
//
// Not here: the reference (reference/norm.hpp), fused residual+norm variants.
#include "kernels/ops/norm.hpp"

#include <cmath>

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
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = inp + n * C;
    // mean = Σx/C
    const float m = row_reduce(
        mode, C, [&](float acc, int64_t i) { return acc + x[i]; },
        [&](int64_t i) { return x[i]; }) / fC;
    // var = Σ(x-mean)²/C, second pass over the centred values (canonical_dot(d, d), d = x - m)
    const float var = row_reduce(
        mode, C,
        [&](float acc, int64_t i) {
          const float d = x[i] - m;
          return std::fma(d, d, acc);
        },
        [&](int64_t i) {
          const float d = x[i] - m;
          return d * d;
        }) / fC;
    // rstd = 1/sqrt(var + eps): three roundings (add, IEEE sqrt, IEEE divide)
    const float r = 1.0f / std::sqrt(var + s.eps);
    float* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = ((x[i] - m) * r) * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = r;
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
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    const float m = mean[n], r = rstd[n];
    const float mean_wd = row_reduce(
        mode, C, [&](float acc, int64_t i) { return acc + weight[i] * dy[i]; },
        [&](int64_t i) { return weight[i] * dy[i]; }) / fC;
    const float mean_wdx = row_reduce(
        mode, C,
        [&](float acc, int64_t i) { return std::fma(weight[i] * dy[i], (x[i] - m) * r, acc); },
        [&](int64_t i) { return (weight[i] * dy[i]) * ((x[i] - m) * r); }) / fC;
    float* dx = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const float xhat = (x[i] - m) * r;
      const float wd = weight[i] * dy[i];
      dx[i] += r * ((wd - mean_wd) - xhat * mean_wdx);
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
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = inp + n * C;
    // rstd = 1/sqrt(Σx²/C + eps), Σx² = canonical_dot(x, x)
    const float ms = row_reduce(
        mode, C, [&](float acc, int64_t i) { return std::fma(x[i], x[i], acc); },
        [&](int64_t i) { return x[i] * x[i]; }) / fC;
    const float r = 1.0f / std::sqrt(ms + s.eps);
    float* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = (x[i] * r) * weight[i];
    rstd[n] = r;
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
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    const float r = rstd[n];
    const float mean_wdx = row_reduce(
        mode, C, [&](float acc, int64_t i) { return std::fma(weight[i] * dy[i], x[i] * r, acc); },
        [&](int64_t i) { return (weight[i] * dy[i]) * (x[i] * r); }) / fC;
    float* dx = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const float xhat = x[i] * r;
      const float wd = weight[i] * dy[i];
      dx[i] += r * (wd - xhat * mean_wdx);
    }
  }
  // dweight[c] += Σ_n dout·xhat (FMA chain).
  detail::reduce_columns_over_tokens(mode, s.N, C, dweight, [&](float acc, int64_t n, int64_t c) {
    return std::fma(dout[n * C + c], inp[n * C + c] * rstd[n], acc);
  });
}

}  // namespace lockstep::cpu
