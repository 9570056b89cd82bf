// Reference causal self-attention with grouped key/value heads, and RoPE, templated on the
// scalar type (double, MPFR, Bounded<T>): the contract of kernels/ops/attention.hpp in plain
// single-threaded loops.
//
// Argument order as the kernels', with explicit dims instead of AttentionShape. Every reduction
// goes through reference::dot / reference::sum, so Real = Bounded<T> yields bounds that hold for
// any summation order (canonical chunks and fast mode alike); exp via ADL (the Bounded exp charges
// the kernels' documented transcendental accuracy). Constants are the kernels' fp32 values.
// RoPE tables are inputs (the kernels' fp32 tables, exact in any Real).
//
// The reductions' index ranges and, for dk/dv, the positions i = j·T + t of the (query head, query)
// pairs are those of kernels/ops/attention.hpp, so CanonicalF32 (reference/canonical_f32.hpp)
// reproduces canonical mode's chunking exactly.
// Not here: any allocation beyond small per-row temporaries, threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/bounded.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

// 1/sqrt(HS) rounded once to fp32, as the kernels compute it.
inline float attention_scale_f32(int64_t HS) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
}

template <class Real>
Real attention_max(const Real& a, const Real& b) {
  if constexpr (IsBounded<Real>::value) {
    return max(a, b);
  } else {
    return a > b ? a : b;
  }
}

// out: (B, T, NH*HS); att: (B, NH, T, T); qkv: (B, T, (NH+2NKV)*HS) rows [q | k | v].
template <class Real>
void attention_forward(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                       Real* out, Real* att, const Real* qkv) {
  using std::exp;
  const int64_t row = (NH + 2 * NKV) * HS, group = NH / NKV;
  const Real scale(attention_scale_f32(HS));
  std::vector<Real> e(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / group;
      const Real* q0 = qkv + b * T * row + h * HS;
      const Real* k0 = qkv + b * T * row + (NH + g) * HS;
      const Real* v0 = qkv + b * T * row + (NH + NKV + g) * HS;
      for (int64_t t = 0; t < T; ++t) {
        Real* a = att + ((b * NH + h) * T + t) * T;
        for (int64_t u = 0; u <= t; ++u) a[u] = dot(q0 + t * row, 1, k0 + u * row, 1, HS) * scale;
        Real m = a[0];
        for (int64_t u = 1; u <= t; ++u) m = attention_max(m, a[u]);
        for (int64_t u = 0; u <= t; ++u) e[u] = exp(a[u] - m);
        const Real Z = sum(e.data(), 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) a[u] = e[u] / Z;
        for (int64_t u = t + 1; u < T; ++u) a[u] = Real(0);
        for (int64_t d = 0; d < HS; ++d) {
          out[(b * T + t) * NH * HS + h * HS + d] = dot(a, 1, v0 + d, row, t + 1);
        }
      }
    }
  }
}

// dqkv: (B, T, (NH+2NKV)*HS) overwritten; scratch: (B, NH, T, T) holds ds; dout: (B, T, NH*HS).
template <class Real>
void attention_backward(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                        Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                        const Real* att) {
  const int64_t row = (NH + 2 * NKV) * HS, group = NH / NKV;
  const Real scale(attention_scale_f32(HS));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / group;
      const Real* k0 = qkv + b * T * row + (NH + g) * HS;
      const Real* v0 = qkv + b * T * row + (NH + NKV + g) * HS;
      for (int64_t t = 0; t < T; ++t) {
        const Real* a = att + ((b * NH + h) * T + t) * T;
        Real* ds = scratch + ((b * NH + h) * T + t) * T;
        const Real* dy = dout + (b * T + t) * NH * HS + h * HS;
        // out[t] = Σ att[t']·v[t']  =>  datt[t,t'] = dout[t]·v[t']
        for (int64_t u = 0; u <= t; ++u) ds[u] = dot(dy, 1, v0 + u * row, 1, HS);
        // att = softmax(s)  =>  ds = att·(datt − Σ att·datt)
        const Real D = dot(a, 1, ds, 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D);
        for (int64_t u = t + 1; u < T; ++u) ds[u] = Real(0);
        // s[t'] = (q[t]·k[t'])·scale  =>  dq[t] = (Σ ds[t,t']·k[t'])·scale
        for (int64_t d = 0; d < HS; ++d) {
          dqkv[(b * T + t) * row + h * HS + d] = dot(ds, 1, k0 + d, row, t + 1) * scale;
        }
      }
    }
  }
  // dk[t'] = (Σ ds[t,t']·q[t])·scale, dv[t'] = Σ att[t,t']·dout[t] over the query heads of the
  // group and t >= t': gathered with their positions i = j·T + t (the kernels' chunk index), then
  // one dot each.
  std::vector<Real> w_k, w_v, x_k, x_v;
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < NKV; ++g) {
      for (int64_t u = 0; u < T; ++u) {
        for (int64_t d = 0; d < HS; ++d) {
          w_k.clear(), w_v.clear(), x_k.clear(), x_v.clear(), pos.clear();
          for (int64_t j = 0; j < group; ++j) {
            const int64_t h = g * group + j;
            for (int64_t t = u; t < T; ++t) {
              const int64_t at = ((b * NH + h) * T + t) * T + u;
              pos.push_back(j * T + t);
              w_k.push_back(scratch[at]);
              x_k.push_back(qkv[(b * T + t) * row + h * HS + d]);
              w_v.push_back(att[at]);
              x_v.push_back(dout[(b * T + t) * NH * HS + h * HS + d]);
            }
          }
          const auto n = static_cast<int64_t>(w_k.size());
          dqkv[(b * T + u) * row + (NH + g) * HS + d] =
              dot_at(pos.data(), w_k.data(), x_k.data(), n) * scale;
          dqkv[(b * T + u) * row + (NH + NKV + g) * HS + d] =
              dot_at(pos.data(), w_v.data(), x_v.data(), n);
        }
      }
    }
  }
}

// RoPE on the q and k heads of qkv (B, T, (NH+2NKV)*HS), in place; tables (T, HS/2).
// x' = x·c − y·s, y' = x·s + y·c for (x, y) = (p[i], p[i + HS/2]).
template <class Real>
void rope_forward(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, Real* qkv,
                  const Real* cos_table, const Real* sin_table) {
  const int64_t row = (NH + 2 * NKV) * HS, half = HS / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t head = 0; head < NH + NKV; ++head) {
        Real* x = qkv + (b * T + t) * row + head * HS;
        for (int64_t i = 0; i < half; ++i) {
          const Real xi = x[i], yi = x[i + half], c = cos_table[t * half + i],
                     s = sin_table[t * half + i];
          x[i] = xi * c - yi * s;
          x[i + half] = xi * s + yi * c;
        }
      }
    }
  }
}

// The transpose of rope_forward's rotation, applied to dqkv in place.
template <class Real>
void rope_backward(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, Real* dqkv,
                   const Real* cos_table, const Real* sin_table) {
  const int64_t row = (NH + 2 * NKV) * HS, half = HS / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t head = 0; head < NH + NKV; ++head) {
        Real* x = dqkv + (b * T + t) * row + head * HS;
        for (int64_t i = 0; i < half; ++i) {
          const Real dx = x[i], dy = x[i + half], c = cos_table[t * half + i],
                     s = sin_table[t * half + i];
          // x' = x·c − y·s, y' = x·s + y·c  =>  dx = dx'·c + dy'·s, dy = dy'·c − dx'·s
          x[i] = dx * c + dy * s;
          x[i + half] = dy * c - dx * s;
        }
      }
    }
  }
}

}  // namespace lockstep::reference
