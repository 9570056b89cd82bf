// Reference LayerNorm and RMSNorm, templated on the scalar type (double, MPFR, Bounded<T>).
//
// Mirrors kernels/ops/norm.hpp operation for operation, in plain single-threaded loops: two-pass
// statistics, every row and token reduction through reference::sum / reference::dot (so
// Bounded<T> carries the order-free bound covering canonical chunks and fast mode), eps as the
// caller's fp32 value. Backward takes the cached mean/rstd as inputs, like the kernels, and
// accumulates (+=) into dinp, dweight and dbias.
// Not here: the kernels' chunking (a bound-level concern only) and any fused variants.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "reference/reduce.hpp"

namespace lockstep::reference {

template <class Real>
void layernorm_forward(int64_t N, int64_t C, float eps,
                       Real* out, Real* mean, Real* rstd,         // (N, C) (N) (N)
                       const Real* inp,                           // (N, C)
                       const Real* weight, const Real* bias) {    // (C) (C)
  using std::sqrt;
  const Real fC = Real(static_cast<double>(C));
  std::vector<Real> d(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    const Real* x = inp + n * C;
    const Real m = sum(x, 1, C) / fC;                    // mean = Σx/C
    for (int64_t i = 0; i < C; ++i) d[i] = x[i] - m;
    const Real var = dot(d.data(), 1, d.data(), 1, C) / fC;  // var = Σ(x-mean)²/C
    const Real r = Real(1) / sqrt(var + Real(eps));      // rstd = 1/sqrt(var + eps)
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = ((d[i] * r) * weight[i]) + bias[i];
    mean[n] = m;
    rstd[n] = r;
  }
}

// Forward: out = ((x - mean)·rstd)·w + b;  xhat = (x - mean)·rstd, wd = w·dout:
//   dinp += rstd·((wd - Σwd/C) - xhat·(Σ wd·xhat)/C);  dweight += Σ_n dout·xhat;  dbias += Σ_n dout
template <class Real>
void layernorm_backward(int64_t N, int64_t C,
                        Real* dinp,                               // (N, C) +=
                        std::type_identity_t<GradOut<Real>> dweight,  // (C) +=, or null
                        std::type_identity_t<GradOut<Real>> dbias,    // (C) +=, or null
                        const Real* dout,                         // (N, C)
                        const Real* inp, const Real* weight,      // (N, C) (C)
                        const Real* mean, const Real* rstd) {     // (N) (N)
  const Real fC = Real(static_cast<double>(C));
  std::vector<Real> xhat(static_cast<size_t>(N * C)), wd(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    Real* xh = xhat.data() + n * C;
    for (int64_t i = 0; i < C; ++i) {
      xh[i] = (inp[n * C + i] - mean[n]) * rstd[n];
      wd[i] = weight[i] * dout[n * C + i];
    }
    const Real mean_wd = sum(wd.data(), 1, C) / fC;
    const Real mean_wdx = dot(wd.data(), 1, xh, 1, C) / fC;
    for (int64_t i = 0; i < C; ++i) {
      dinp[n * C + i] += rstd[n] * ((wd[i] - mean_wd) - xh[i] * mean_wdx);
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    if (dweight) grad_dot(dweight, c, dout + c, C, xhat.data() + c, C, N);
    if (dbias) grad_sum(dbias, c, dout + c, C, N);
  }
}

template <class Real>
void rmsnorm_forward(int64_t N, int64_t C, float eps,
                     Real* out, Real* rstd,                       // (N, C) (N)
                     const Real* inp, const Real* weight) {       // (N, C) (C)
  using std::sqrt;
  const Real fC = Real(static_cast<double>(C));
  for (int64_t n = 0; n < N; ++n) {
    const Real* x = inp + n * C;
    const Real r = Real(1) / sqrt(dot(x, 1, x, 1, C) / fC + Real(eps));  // 1/sqrt(Σx²/C + eps)
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = (x[i] * r) * weight[i];
    rstd[n] = r;
  }
}

// Forward: out = (x·rstd)·w;  xhat = x·rstd, wd = w·dout:
//   dinp += rstd·(wd - xhat·(Σ wd·xhat)/C);  dweight += Σ_n dout·xhat
template <class Real>
void rmsnorm_backward(int64_t N, int64_t C,
                      Real* dinp,                                 // (N, C) +=
                      std::type_identity_t<GradOut<Real>> dweight,  // (C) += or null
                      const Real* dout,                           // (N, C)
                      const Real* inp, const Real* weight,        // (N, C) (C)
                      const Real* rstd) {                         // (N)
  const Real fC = Real(static_cast<double>(C));
  std::vector<Real> xhat(static_cast<size_t>(N * C)), wd(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    Real* xh = xhat.data() + n * C;
    for (int64_t i = 0; i < C; ++i) {
      xh[i] = inp[n * C + i] * rstd[n];
      wd[i] = weight[i] * dout[n * C + i];
    }
    const Real mean_wdx = dot(wd.data(), 1, xh, 1, C) / fC;
    for (int64_t i = 0; i < C; ++i) dinp[n * C + i] += rstd[n] * (wd[i] - xh[i] * mean_wdx);
  }
  if (!dweight) return;
  for (int64_t c = 0; c < C; ++c) grad_dot(dweight, c, dout + c, C, xhat.data() + c, C, N);
}

}  // namespace lockstep::reference
