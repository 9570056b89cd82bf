// The canonical contract of every CPU op (kernels/ops/*.hpp), transcribed as plain scalar loops
// over canonical.hpp's canonical_dot / canonical_sum / chunk chains and transcendental.hpp's
// ls_expf / ls_logf / ls_tanhf: what each canonical-mode kernel must equal bit for bit.
//
// Written from the op headers' contract text, one statement per formula, in the order the header
// states it; compiled with -ffp-contract=off like the kernels, so every `a*b + c` here is two
// roundings and every intended FMA is an explicit std::fma inside canonical.hpp.
// Not here: threads, SIMD, fast mode (checked within bounds instead), or the Bounded reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/transcendental.hpp"

namespace lockstep::prop::spec {

// Token reduction over [0, n) with chunks of 64 global indices from 0 (token_offset 0), each chunk
// one FMA chain from +0, partials combined exactly and rounded once: canonical_dot itself.
// (Kept as a name so that the parameter-gradient specs below read like their headers.)
inline float token_dot(const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) {
  return canonical_dot(a, sa, b, sb, n);
}

// linear.hpp: out[n,o] = canonical_dot(inp[n,:], weight[o,:]) + bias[o]
inline void linear_forward(int64_t N, int64_t IC, int64_t OC, float* out, const float* inp,
                           const float* weight, const float* bias) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      float v = canonical_dot(inp + n * IC, 1, weight + o * IC, 1, IC);
      if (bias != nullptr) v = v + bias[o];
      out[n * OC + o] = v;
    }
  }
}

// linear.hpp backward with dweight/dbias into a zeroed exact accumulator (rounded once).
inline void linear_backward(int64_t N, int64_t IC, int64_t OC, float* dinp, float* dweight,
                            float* dbias, const float* dout, const float* inp, const float* weight) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < IC; ++i) {
      dinp[n * IC + i] = canonical_dot(dout + n * OC, 1, weight + i, IC, OC);
    }
  }
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t i = 0; i < IC; ++i) dweight[o * IC + i] = token_dot(dout + o, OC, inp + i, IC, N);
    dbias[o] = canonical_sum(dout + o, OC, N);
  }
}

// embedding.hpp: out = wte[token] + wpe[t] (one add); backward chains per chunk of 64 global token
// indices over the contributing tokens, partials combined exactly (a chunk without any adds none).
inline void embedding_backward(int64_t B, int64_t T, int64_t C, int64_t V, float* dwte,
                               float* dwpe, const float* dout, const int32_t* tokens) {
  const int64_t N = B * T;
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t c = 0; c < C; ++c) {
      ChunkCombiner comb;
      for (int64_t n0 = 0; n0 < N; n0 += kCanonicalChunk) {
        float acc = 0.0f;
        bool any = false;
        for (int64_t n = n0; n < N && n < n0 + kCanonicalChunk; ++n) {
          if (tokens[n] != v) continue;
          acc = acc + dout[n * C + c];
          any = true;
        }
        if (any) comb.add(acc);
      }
      dwte[v * C + c] = comb.finish();
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      ChunkCombiner comb;
      for (int64_t n0 = 0; n0 < N; n0 += kCanonicalChunk) {
        float acc = 0.0f;
        bool any = false;
        for (int64_t n = n0; n < N && n < n0 + kCanonicalChunk; ++n) {
          if (n % T != t) continue;
          acc = acc + dout[n * C + c];
          any = true;
        }
        if (any) comb.add(acc);
      }
      dwpe[t * C + c] = comb.finish();
    }
  }
}

// norm.hpp LayerNorm: m = Σx / C; d = x - m; var = Σ d·d / C; r = 1 / sqrt(var + eps);
// out = ((d·r)·w) + b
inline void layernorm_forward(int64_t N, int64_t C, float eps, float* out, float* mean, float* rstd,
                              const float* inp, const float* w, const float* b) {
  const auto fC = static_cast<float>(C);
  std::vector<float> d(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float m = canonical_sum(x, 1, C) / fC;
    for (int64_t i = 0; i < C; ++i) d[i] = x[i] - m;
    const float var = canonical_dot(d.data(), 1, d.data(), 1, C) / fC;
    const float r = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = ((d[i] * r) * w[i]) + b[i];
    mean[n] = m;
    rstd[n] = r;
  }
}

// norm.hpp backward (LayerNorm when mean != nullptr, else RMSNorm):
//   xhat = (x - m)·r  or  x·r;  wd = w·dout;  mean_wd = canonical_sum(wd)/C;
//   mean_wdx = canonical_dot(wd, xhat)/C
//   dinp += r·((wd - mean_wd) - xhat·mean_wdx)   or   r·(wd - xhat·mean_wdx)
//   dweight = Σ_tokens dout·xhat, dbias = Σ_tokens dout (zeroed exact accumulators)
inline void norm_backward(int64_t N, int64_t C, float* dinp, float* dweight, float* dbias,
                          const float* dout, const float* inp, const float* w, const float* mean,
                          const float* rstd) {
  const auto fC = static_cast<float>(C);
  std::vector<float> xhat(static_cast<size_t>(N * C)), wd(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    float* xh = xhat.data() + n * C;
    const float r = rstd[n];
    for (int64_t i = 0; i < C; ++i) {
      xh[i] = mean != nullptr ? (inp[n * C + i] - mean[n]) * r : inp[n * C + i] * r;
      wd[i] = w[i] * dout[n * C + i];
    }
    const float mean_wdx = canonical_dot(wd.data(), 1, xh, 1, C) / fC;
    if (mean != nullptr) {
      const float mean_wd = canonical_sum(wd.data(), 1, C) / fC;
      for (int64_t i = 0; i < C; ++i) {
        dinp[n * C + i] += r * ((wd[i] - mean_wd) - xh[i] * mean_wdx);
      }
    } else {
      for (int64_t i = 0; i < C; ++i) dinp[n * C + i] += r * (wd[i] - xh[i] * mean_wdx);
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dweight[c] = token_dot(dout + c, C, xhat.data() + c, C, N);
    if (dbias != nullptr) dbias[c] = canonical_sum(dout + c, C, N);
  }
}

// norm.hpp RMSNorm: r = 1 / sqrt(Σ x·x / C + eps);  out = (x·r)·w
inline void rmsnorm_forward(int64_t N, int64_t C, float eps, float* out, float* rstd,
                            const float* inp, const float* w) {
  const auto fC = static_cast<float>(C);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float r = 1.0f / std::sqrt(canonical_dot(x, 1, x, 1, C) / fC + eps);
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = (x[i] * r) * w[i];
    rstd[n] = r;
  }
}

// activation.hpp constants and formulas (canonical: own tanh/exp).
inline constexpr float kK0 = 0.7978845608028654f;  // sqrt(2/π) rounded to fp32
inline constexpr float kK1 = 0.044715f;

inline float gelu(float x) {
  return (0.5f * x) * (1.0f + ls_tanhf(kK0 * (x + kK1 * ((x * x) * x))));
}
inline float gelu_grad(float x, float dout) {
  const float k3 = 3.0f * kK1;
  const float x2 = x * x;
  const float th = ls_tanhf(kK0 * (x + kK1 * (x2 * x)));
  const float sech2 = (1.0f - th) * (1.0f + th);
  const float term = sech2 == 0.0f ? 0.0f : ((0.5f * x) * sech2) * (kK0 * (1.0f + k3 * x2));
  return (0.5f * (1.0f + th) + term) * dout;
}
inline float swiglu(float g, float up) { return (g / (1.0f + ls_expf(-g))) * up; }
inline void swiglu_grad(float g, float up, float dout, float* dgate, float* dup) {
  const float den = 1.0f + ls_expf(-g);
  const float sig = 1.0f / den;
  *dgate = (dout * up) * (sig * (1.0f + g * (1.0f - sig)));
  *dup = dout * (g / den);
}

// crossentropy.hpp: m = max; Z = canonical_sum of ls_expf(x - m); loss = (m + log Z) - x[y];
// dlogits = (ls_expf(x - m) / Z - [v == y])·dloss
inline void crossentropy(int64_t N, int64_t V, float dloss, float* losses, float* dlogits,
                         const float* logits, const int32_t* targets) {
  std::vector<float> e(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
    for (int64_t v = 0; v < V; ++v) e[v] = ls_expf(x[v] - m);
    const float Z = canonical_sum(e.data(), 1, V);
    losses[n] = (m + ls_logf(Z)) - x[targets[n]];
    if (dlogits == nullptr) continue;
    for (int64_t v = 0; v < V; ++v) {
      dlogits[n * V + v] = (e[v] / Z - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
    }
  }
}

// attention.hpp forward and backward, element by element.
struct AttentionDims {
  int64_t B, T, NH, NKV, HS;
  int64_t row() const { return (NH + 2 * NKV) * HS; }
};

inline float attention_scale(int64_t HS) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
}

inline void attention_forward(AttentionDims s, float* out, float* att, const float* qkv) {
  const int64_t row = s.row(), group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
  std::vector<float> e(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * row;
      for (int64_t t = 0; t < T; ++t) {
        float* a = att + ((b * s.NH + h) * T + t) * T;
        for (int64_t u = 0; u <= t; ++u) {
          a[u] = canonical_dot(base + t * row + h * HS, 1, base + u * row + (s.NH + g) * HS, 1, HS) *
                 scale;
        }
        float m = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) m = a[u] > m ? a[u] : m;
        for (int64_t u = 0; u <= t; ++u) e[u] = ls_expf(a[u] - m);
        const float Z = canonical_sum(e.data(), 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) a[u] = e[u] / Z;
        for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
        for (int64_t d = 0; d < HS; ++d) {
          out[(b * T + t) * s.NH * HS + h * HS + d] =
              canonical_dot(a, 1, base + (s.NH + s.NKV + g) * HS + d, row, t + 1);
        }
      }
    }
  }
}

inline void attention_backward(AttentionDims s, float* dqkv, const float* dout, const float* qkv,
                               const float* att) {
  const int64_t row = s.row(), group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
  std::vector<float> ds(static_cast<size_t>(s.B * s.NH * T * T), 0.0f);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * row;
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * s.NH + h) * T + t) * T;
        float* dsr = ds.data() + ((b * s.NH + h) * T + t) * T;
        const float* dy = dout + (b * T + t) * s.NH * HS + h * HS;
        for (int64_t u = 0; u <= t; ++u) {
          dsr[u] = canonical_dot(dy, 1, base + u * row + (s.NH + s.NKV + g) * HS, 1, HS);
        }
        const float D = canonical_dot(a, 1, dsr, 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) dsr[u] = a[u] * (dsr[u] - D);
        for (int64_t d = 0; d < HS; ++d) {
          dqkv[(b * T + t) * row + h * HS + d] =
              canonical_dot(dsr, 1, base + (s.NH + g) * HS + d, row, t + 1) * scale;
        }
      }
    }
  }
  // dk, dv: pairs (j, t), i = j·T + t, chunks of 64 over i, pairs with t < t' skipped.
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.NKV; ++g) {
      for (int64_t u = 0; u < T; ++u) {
        for (int64_t d = 0; d < HS; ++d) {
          ChunkCombiner ck, cv;
          for (int64_t i0 = 0; i0 < group * T; i0 += kCanonicalChunk) {
            float acc_k = 0.0f, acc_v = 0.0f;
            for (int64_t i = i0; i < group * T && i < i0 + kCanonicalChunk; ++i) {
              const int64_t j = i / T, t = i % T, h = g * group + j;
              if (t < u) continue;
              const int64_t at = ((b * s.NH + h) * T + t) * T + u;
              acc_k = std::fma(ds[at], qkv[(b * T + t) * row + h * HS + d], acc_k);
              acc_v = std::fma(att[at], dout[(b * T + t) * s.NH * HS + h * HS + d], acc_v);
            }
            ck.add(acc_k);
            cv.add(acc_v);
          }
          dqkv[(b * T + u) * row + (s.NH + g) * HS + d] = ck.finish() * scale;
          dqkv[(b * T + u) * row + (s.NH + s.NKV + g) * HS + d] = cv.finish();
        }
      }
    }
  }
}

// optim.hpp AdamW, one fp32 rounding per operation, in the header's order.
struct AdamW {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
};
inline void adamw(const AdamW& h, float& p, float& m, float& v, float g) {
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  m = h.beta1 * m + omb1 * g;
  v = h.beta2 * v + omb2 * (g * g);
  const float mhat = m / h.bc1, vhat = v / h.bc2;
  p = p - h.lr * (mhat / (std::sqrt(vhat) + h.eps) + h.weight_decay * p);
}

}  // namespace lockstep::prop::spec
