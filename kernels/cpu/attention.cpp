// Causal self-attention with grouped key/value heads on the CPU: forward and backward, canonical
// and fast modes (contract in kernels/ops/attention.hpp).
//
// Canonical mode follows the header's reductions literally. Reductions whose result is a vector
// over HS (out[t], dq[t], dk[t'], dv[t']) run HS chains side by side, one chain per output
// element, so that the compiler may vectorise across d without changing any chain; each chunk of
// 64 reduction indices ends with its HS partials going into HS exact combiners (canonical.hpp).
// Threads take whole (b, h) pairs — (b, g) pairs for dk/dv — never part of a reduction, so the
// bits do not depend on the thread count.
// Fast mode: plain fp32 loops in whatever order is convenient, libm expf.
//
// Not here: RoPE (rope.cpp), the QKV and output projections (linear.cpp), flash-style tiling
// (the (B, NH, T, T) probabilities are materialised and cached for backward, as in llm.c).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops/attention.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

void check_shape(AttentionShape s, const char* op) {
  LS_REQUIRE(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, op,
             ": B, T, NH, NKV, HS must be positive (got B=", s.B, " T=", s.T, " NH=", s.NH,
             " NKV=", s.NKV, " HS=", s.HS, ")");
  LS_REQUIRE(s.NH % s.NKV == 0, op, ": NH (", s.NH, ") must be a multiple of NKV (", s.NKV, ")");
}

// 1/sqrt(HS) rounded once to fp32 (sqrt and the division are correctly rounded in double, and
// the double -> float conversion rounds once more: the same value on every machine).
float attention_scale(int64_t HS) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS))); }

// Offsets of the q, k and v heads inside a qkv row.
struct Layout {
  int64_t row, HS, NH, NKV;
  int64_t q(int64_t h) const { return h * HS; }
  int64_t k(int64_t g) const { return (NH + g) * HS; }
  int64_t v(int64_t g) const { return (NH + NKV + g) * HS; }
};
Layout layout_of(AttentionShape s) { return {(s.NH + 2 * s.NKV) * s.HS, s.HS, s.NH, s.NKV}; }

// HS canonical reductions run side by side: `link(acc)` performs one link of every chain; chunk
// ends feed the exact combiners. Buffers are per thread and reused across rows.
class VectorReduction {
 public:
  explicit VectorReduction(int64_t n) : acc_(n), comb_(n) {}
  void start() {
    for (auto& c : comb_) c = ChunkCombiner{};
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  }
  float* acc() { return acc_.data(); }
  // Closes the current chunk: its partials go into the combiners and a new chain starts at +0.
  void end_chunk() {
    for (size_t d = 0; d < acc_.size(); ++d) {
      comb_[d].add(acc_[d]);
      acc_[d] = 0.0f;
    }
  }
  // Rounds every combiner once and writes dst[d] = result · factor (one more fp32 rounding).
  void finish(float* dst, float factor) const {
    for (size_t d = 0; d < comb_.size(); ++d) dst[d] = comb_[d].finish() * factor;
  }

 private:
  std::vector<float> acc_;
  std::vector<ChunkCombiner> comb_;
};

// One link of HS chains: acc[d] = fma(w, x[d], acc[d]).
inline void fma_link(float* acc, float w, const float* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) acc[d] = std::fma(w, x[d], acc[d]);
}

// Rows of per-thread scratch holding one head's keys (or values) transposed, (HS, T): lane u of
// a SIMD register then reads key u, so that many dot products run side by side.
void transpose_head(const float* base, int64_t row, int64_t offset, int64_t T, int64_t HS,
                    float* yt) {
  for (int64_t u = 0; u < T; ++u) {
    for (int64_t d = 0; d < HS; ++d) yt[d * T + u] = base[u * row + offset + d];
  }
}

// out[u] = canonical_dot over d in [0, HS) of x[d]·y_u[d] for u in [0, rows), from yt = the rows
// y_u transposed (HS, T). For HS <= 64 there is one chunk: each u's chain is the scalar chain of
// canonical_dot, run for all u side by side (the compiler vectorises across u without reordering
// any chain), and the exact combination of a single partial p is 0.0 + p, which turns −0 into +0.
// Longer heads take canonical_dot itself.
void dot_rows(const float* x, const float* yt, int64_t T, int64_t rows, int64_t HS,
              const float* base, int64_t row, int64_t offset, float* out) {
  if (HS > kCanonicalChunk) {
    for (int64_t u = 0; u < rows; ++u) out[u] = canonical_dot(x, 1, base + u * row + offset, 1, HS);
    return;
  }
  for (int64_t u = 0; u < rows; ++u) out[u] = 0.0f;
  for (int64_t d = 0; d < HS; ++d) {
    const float xd = x[d];
    const float* y = yt + d * T;
    for (int64_t u = 0; u < rows; ++u) out[u] = std::fma(xd, y[u], out[u]);
  }
  for (int64_t u = 0; u < rows; ++u) out[u] = out[u] + 0.0f;
}

void forward_canonical(AttentionShape s, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
#pragma omp parallel
  {
    VectorReduction red(HS);
    std::vector<float> kt(HS * T);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        transpose_head(base, L.row, L.k(g), T, HS, kt.data());
        for (int64_t t = 0; t < T; ++t) {
          float* a = att + ((b * s.NH + h) * T + t) * T;
          const float* q = base + t * L.row + L.q(h);
          // s[t'] = canonical_dot over HS of q[t]·k[t'], then · scale
          dot_rows(q, kt.data(), T, t + 1, HS, base, L.row, L.k(g), a);
          float m = -INFINITY;
          for (int64_t u = 0; u <= t; ++u) {
            a[u] = a[u] * scale;
            m = a[u] > m ? a[u] : m;  // a NaN score is skipped here but makes Z, so the row, NaN
          }
          // e[t'] = exp(s[t'] − m);  Z = canonical_sum over t' of e
          for (int64_t u = 0; u <= t; ++u) a[u] = ls_expf(a[u] - m);
          const float Z = canonical_sum(a, 1, t + 1);
          for (int64_t u = 0; u <= t; ++u) a[u] = a[u] / Z;
          for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
          // out[t] = canonical_dot over t' in [0, t] of att[t']·v[t'], HS chains side by side
          red.start();
          for (int64_t u = 0; u <= t; ++u) {
            fma_link(red.acc(), a[u], base + u * L.row + L.v(g), HS);
            if ((u + 1) % kCanonicalChunk == 0) red.end_chunk();
          }
          if ((t + 1) % kCanonicalChunk != 0) red.end_chunk();
          red.finish(out + (b * T + t) * s.NH * HS + h * HS, 1.0f);
        }
      }
    }
  }
}

void forward_fast(AttentionShape s, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * L.row;
      for (int64_t t = 0; t < T; ++t) {
        float* a = att + ((b * s.NH + h) * T + t) * T;
        const float* q = base + t * L.row + L.q(h);
        float m = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = base + u * L.row + L.k(g);
          float dot = 0.0f;
          for (int64_t d = 0; d < HS; ++d) dot += q[d] * k[d];
          a[u] = dot * scale;
          m = a[u] > m ? a[u] : m;
        }
        float Z = 0.0f;
        for (int64_t u = 0; u <= t; ++u) {
          a[u] = std::exp(a[u] - m);
          Z += a[u];
        }
        for (int64_t u = 0; u <= t; ++u) a[u] = a[u] / Z;
        for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
        float* o = out + (b * T + t) * s.NH * HS + h * HS;
        for (int64_t d = 0; d < HS; ++d) o[d] = 0.0f;
        for (int64_t u = 0; u <= t; ++u) {
          const float* v = base + u * L.row + L.v(g);
          for (int64_t d = 0; d < HS; ++d) o[d] += a[u] * v[d];
        }
      }
    }
  }
}

// ds = att·(datt − D) into scratch, per (b, h) row; shared by both modes up to the reductions.
// `dot` is the reduction used for D (canonical_dot, or a plain fp32 loop); canonical mode
// computes the rows of datt with dot_rows (the same chains as canonical_dot), fast mode with `dot`.
template <class Dot>
void softmax_backward_rows(AttentionShape s, float* scratch, const float* dout, const float* qkv,
                           const float* att, bool canonical, Dot dot) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
#pragma omp parallel
  {
    std::vector<float> vt(canonical ? HS * T : 0);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        if (canonical) transpose_head(base, L.row, L.v(g), T, HS, vt.data());
        for (int64_t t = 0; t < T; ++t) {
          const float* a = att + ((b * s.NH + h) * T + t) * T;
          float* ds = scratch + ((b * s.NH + h) * T + t) * T;
          const float* dy = dout + (b * T + t) * s.NH * HS + h * HS;
          // datt[t,t'] = dot over HS of dout[t]·v[t']     (forward: out[t] = Σ att[t']·v[t'])
          if (canonical) {
            dot_rows(dy, vt.data(), T, t + 1, HS, base, L.row, L.v(g), ds);
          } else {
            for (int64_t u = 0; u <= t; ++u) ds[u] = dot(dy, base + u * L.row + L.v(g), HS);
          }
          // D[t] = dot over t' of att[t,t']·datt[t,t']
          const float D = dot(a, ds, t + 1);
          // ds[t,t'] = att[t,t']·(datt[t,t'] − D[t])      (forward: att = exp(s − m) / Z)
          for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D);
          for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
        }
      }
    }
  }
}

void backward_canonical(AttentionShape s, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
  softmax_backward_rows(s, scratch, dout, qkv, att, /*canonical=*/true,
                        [](const float* x, const float* y, int64_t n) {
                          return canonical_dot(x, 1, y, 1, n);
                        });
#pragma omp parallel
  {
    VectorReduction red_k(HS), red_v(HS);
    // dq[t] = (canonical_dot over t' <= t of ds[t,t']·k[t']) · scale
    //   (forward: s[t'] = (q[t]·k[t']) · scale)
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        for (int64_t t = 0; t < T; ++t) {
          const float* ds = scratch + ((b * s.NH + h) * T + t) * T;
          red_k.start();
          for (int64_t u = 0; u <= t; ++u) {
            fma_link(red_k.acc(), ds[u], qkv + (b * T + u) * L.row + L.k(g), HS);
            if ((u + 1) % kCanonicalChunk == 0) red_k.end_chunk();
          }
          if ((t + 1) % kCanonicalChunk != 0) red_k.end_chunk();
          red_k.finish(dqkv + (b * T + t) * L.row + L.q(h), scale);
        }
      }
    }
    // dk[t'] = (Σ ds[t,t']·q[t]) · scale and dv[t'] = Σ att[t,t']·dout[t] over the pairs (j, t),
    // t >= t', in the order i = j·T + t, chunk = ⌊i / 64⌋ (the header's contract). Pairs with
    // t < t' are not links of the chain; chunks that hold none of them close with a +0 partial.
    //   (forward: s[t'] = (q[t]·k[t'])·scale and out[t] = Σ att[t,t']·v[t'])
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t g = 0; g < s.NKV; ++g) {
        for (int64_t u = 0; u < T; ++u) {
          red_k.start();
          red_v.start();
          const int64_t pairs = group * T;
          for (int64_t c0 = 0; c0 < pairs; c0 += kCanonicalChunk) {
            const int64_t c1 = std::min(c0 + kCanonicalChunk, pairs);
            for (int64_t i = c0; i < c1; ++i) {
              const int64_t j = i / T, t = i % T;
              if (t < u) continue;
              const int64_t h = g * group + j;
              const int64_t at = ((b * s.NH + h) * T + t) * T + u;
              fma_link(red_k.acc(), scratch[at], qkv + (b * T + t) * L.row + L.q(h), HS);
              fma_link(red_v.acc(), att[at], dout + (b * T + t) * s.NH * HS + h * HS, HS);
            }
            red_k.end_chunk();
            red_v.end_chunk();
          }
          red_k.finish(dqkv + (b * T + u) * L.row + L.k(g), scale);
          red_v.finish(dqkv + (b * T + u) * L.row + L.v(g), 1.0f);
        }
      }
    }
  }
}

void backward_fast(AttentionShape s, float* dqkv, float* scratch, const float* dout,
                   const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = attention_scale(HS);
  softmax_backward_rows(s, scratch, dout, qkv, att, /*canonical=*/false, [](const float* x, const float* y, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
    return acc;
  });
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* ds = scratch + ((b * s.NH + h) * T + t) * T;
        float* dq = dqkv + (b * T + t) * L.row + L.q(h);
        for (int64_t d = 0; d < HS; ++d) dq[d] = 0.0f;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = qkv + (b * T + u) * L.row + L.k(g);
          for (int64_t d = 0; d < HS; ++d) dq[d] += ds[u] * k[d];
        }
        for (int64_t d = 0; d < HS; ++d) dq[d] *= scale;
      }
    }
  }
  // dk, dv: each (b, g) pair owns its rows, so the (j, t) sums run on one thread.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.NKV; ++g) {
      for (int64_t u = 0; u < T; ++u) {
        float* dk = dqkv + (b * T + u) * L.row + L.k(g);
        float* dv = dqkv + (b * T + u) * L.row + L.v(g);
        for (int64_t d = 0; d < HS; ++d) dk[d] = dv[d] = 0.0f;
        for (int64_t j = 0; j < group; ++j) {
          const int64_t h = g * group + j;
          for (int64_t t = u; t < T; ++t) {
            const int64_t at = ((b * s.NH + h) * T + t) * T + u;
            const float* q = qkv + (b * T + t) * L.row + L.q(h);
            const float* dy = dout + (b * T + t) * s.NH * HS + h * HS;
            for (int64_t d = 0; d < HS; ++d) {
              dk[d] += scratch[at] * q[d];
              dv[d] += att[at] * dy[d];
            }
          }
        }
        for (int64_t d = 0; d < HS; ++d) dk[d] *= scale;
      }
    }
  }
}

}  // namespace

void attention_forward(Mode mode, AttentionShape s, float* out, float* att, const float* qkv) {
  check_shape(s, "attention_forward");
  if (mode == Mode::kCanonical) {
    forward_canonical(s, out, att, qkv);
  } else {
    forward_fast(s, out, att, qkv);
  }
}

void attention_backward(Mode mode, AttentionShape s, float* dqkv, float* scratch,
                        const float* dout, const float* qkv, const float* att) {
  check_shape(s, "attention_backward");
  if (mode == Mode::kCanonical) {
    backward_canonical(s, dqkv, scratch, dout, qkv, att);
  } else {
    backward_fast(s, dqkv, scratch, dout, qkv, att);
  }
}

}  // namespace lockstep::cpu
