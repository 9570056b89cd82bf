// Causal self-attention with grouped key/value heads on the CPU: forward and backward, canonical
// and fast modes (contract in kernels/ops/attention.hpp).
//
// Canonical mode follows the header's reductions literally. Reductions whose result is a vector
// over HS (out[t], dq[t], dk[t'], dv[t']) run HS chains side by side, one chain per output
// element, so that the compiler may vectorise across d without changing any chain; each chunk of
// 64 reduction indices ends with its HS partials going into HS exact combiners (canonical.hpp).
// Threads take whole (b, h) pairs — (b, g) pairs for dk/dv — never part of a reduction, so the
// bits do not depend on the thread count.
// Fast mode: OpenBLAS sgemm over blocks of rows, softmax with the 8-lane ls_expf (forward_fast).
//
// Not here: RoPE (rope.cpp), the QKV and output projections (linear.cpp), flash-style tiling
// (the (B, NH, T, T) probabilities are materialised and cached for backward, as in llm.c).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd_math.hpp"
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

// Fast mode: per (b, h) the products run as OpenBLAS sgemm on blocks of kBlock query rows, each
// over the keys it can see. Inside the diagonal block a row t also meets keys t' > t: their scores
// are computed and then overwritten by the masked 0, but products that would multiply those zeros
// into sums (att·v, ds·k, ds·q, att·dout) run as explicit loops over t' <= t only, so a non-finite
// value in a masked position never reaches a result (0·inf would be NaN). Threads take (b, h)
// pairs with OpenBLAS single-threaded inside (see BlasSerial); softmax is 8 lanes wide (simd_math).
constexpr int64_t kBlock = 64;

// OpenBLAS runs single-threaded for the duration of a scope: the caller's threads already split
// the (b, h) pairs, and OpenBLAS's own pool on top would oversubscribe the cores.
class BlasSerial {
 public:
  BlasSerial() : threads_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~BlasSerial() { openblas_set_num_threads(threads_); }
  BlasSerial(const BlasSerial&) = delete;
  BlasSerial& operator=(const BlasSerial&) = delete;

 private:
  int threads_;
};

// C (M, N) = alpha·A·op(B) + beta·C, row-major, B transposed or not.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

// y[d] += w·x[d] for d < n (the diagonal-block terms of the fast products).
inline void axpy(float* y, float w, const float* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += w * x[d];
}

// Row t of the scores, a[0..t] on entry: a = softmax(a) over [0, t], a[t'] = 0 beyond (to T).
void softmax_row_fast(float* a, int64_t t, int64_t T) {
  const int64_t n = t + 1, nv = n / 8 * 8;
  float m = -INFINITY;
  for (int64_t u = 0; u < n; ++u) m = a[u] > m ? a[u] : m;
  const simd::V8 mv = simd::set1(m);
  simd::V8 zv = _mm256_setzero_ps();
  for (int64_t u = 0; u < nv; u += 8) {
    const simd::V8 e = simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(a + u), mv));
    _mm256_storeu_ps(a + u, e);
    zv = _mm256_add_ps(zv, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, zv);
  float Z = 0.0f;
  for (float l : lanes) Z += l;
  for (int64_t u = nv; u < n; ++u) {
    a[u] = ls_expf(a[u] - m);
    Z += a[u];
  }
  const simd::V8 Zv = simd::set1(Z);
  for (int64_t u = 0; u < nv; u += 8) _mm256_storeu_ps(a + u, _mm256_div_ps(_mm256_loadu_ps(a + u), Zv));
  for (int64_t u = nv; u < n; ++u) a[u] = a[u] / Z;
  for (int64_t u = n; u < T; ++u) a[u] = 0.0f;
}

void forward_fast(AttentionShape s, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS;
  const float scale = attention_scale(HS);
  BlasSerial serial;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * L.row;
      float* A = att + (b * s.NH + h) * T * T;
      float* o = out + b * T * ldo + h * HS;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(r0 + kBlock, T);
        // s[t, t'] = (q[t]·k[t'])·scale for t' < r1 (the masked ones are overwritten below)
        gemm(false, true, r1 - r0, r1, HS, scale, base + r0 * L.row + L.q(h), L.row,
             base + L.k(g), L.row, 0.0f, A + r0 * T, T);
        for (int64_t t = r0; t < r1; ++t) softmax_row_fast(A + t * T, t, T);
        // out[t] = Σ_{t' <= t} att[t, t']·v[t']: keys before the block by sgemm, then the diagonal
        if (r0 > 0) {
          gemm(false, false, r1 - r0, HS, r0, 1.0f, A + r0 * T, T, base + L.v(g), L.row, 0.0f,
               o + r0 * ldo, ldo);
        } else {
          for (int64_t t = r0; t < r1; ++t) std::fill(o + t * ldo, o + t * ldo + HS, 0.0f);
        }
        for (int64_t t = r0; t < r1; ++t) {
          for (int64_t u = r0; u <= t; ++u) axpy(o + t * ldo, A[t * T + u], base + u * L.row + L.v(g), HS);
        }
      }
    }
  }
}

// Canonical: ds = att·(datt − D) into scratch, per (b, h) row; the rows of datt by dot_rows (the
// chains of canonical_dot), D by canonical_dot.
void softmax_backward_rows_canonical(AttentionShape s, float* scratch, const float* dout,
                                     const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS;
#pragma omp parallel
  {
    std::vector<float> vt(HS * T);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        transpose_head(base, L.row, L.v(g), T, HS, vt.data());
        for (int64_t t = 0; t < T; ++t) {
          const float* a = att + ((b * s.NH + h) * T + t) * T;
          float* ds = scratch + ((b * s.NH + h) * T + t) * T;
          const float* dy = dout + (b * T + t) * s.NH * HS + h * HS;
          // datt[t,t'] = dot over HS of dout[t]·v[t']     (forward: out[t] = Σ att[t']·v[t'])
          dot_rows(dy, vt.data(), T, t + 1, HS, base, L.row, L.v(g), ds);
          // D[t] = dot over t' of att[t,t']·datt[t,t']
          const float D = canonical_dot(a, 1, ds, 1, t + 1);
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
  softmax_backward_rows_canonical(s, scratch, dout, qkv, att);
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
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS;
  const float scale = attention_scale(HS);
  BlasSerial serial;
  // Every (b, g) pair owns its k/v gradient rows, so threads split (b, g); its query heads run in
  // turn, the first overwriting dk/dv (beta 0), the others adding.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.NKV; ++g) {
      const float* base = qkv + b * T * L.row;
      float* dbase = dqkv + b * T * L.row;
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = g * group + j;
        const float* A = att + (b * s.NH + h) * T * T;
        float* dS = scratch + (b * s.NH + h) * T * T;
        const float* dy = dout + b * T * ldo + h * HS;
        const float beta = j == 0 ? 0.0f : 1.0f;
        for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
          const int64_t r1 = std::min(r0 + kBlock, T);
          // datt[t, t'] = dout[t]·v[t'] for t' < r1   (forward: out[t] = Σ att[t, t']·v[t'])
          gemm(false, true, r1 - r0, r1, HS, 1.0f, dy + r0 * ldo, ldo, base + L.v(g), L.row, 0.0f,
               dS + r0 * T, T);
          // ds = att·(datt − D), D[t] = Σ_{t' <= t} att·datt   (forward: att = exp(s − m) / Z)
          for (int64_t t = r0; t < r1; ++t) {
            const float* a = A + t * T;
            float* ds = dS + t * T;
            float D = 0.0f;
            for (int64_t u = 0; u <= t; ++u) D += a[u] * ds[u];
            for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D);
            for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
          }
          // dq[t] = scale·Σ_{t' <= t} ds[t, t']·k[t']   (forward: s = (q·k)·scale)
          float* dq = dbase + L.q(h);
          if (r0 > 0) {
            gemm(false, false, r1 - r0, HS, r0, scale, dS + r0 * T, T, base + L.k(g), L.row, 0.0f,
                 dq + r0 * L.row, L.row);
          } else {
            for (int64_t t = r0; t < r1; ++t) std::fill(dq + t * L.row, dq + t * L.row + HS, 0.0f);
          }
          for (int64_t t = r0; t < r1; ++t) {
            for (int64_t u = r0; u <= t; ++u) axpy(dq + t * L.row, scale * dS[t * T + u], base + u * L.row + L.k(g), HS);
          }
        }
        // dk[t'] = scale·Σ_{t >= t'} ds[t, t']·q[t] and dv[t'] = Σ_{t >= t'} att[t, t']·dout[t], by
        // blocks of keys [c0, c1): queries after the block by sgemm, then the diagonal block.
        float* dk = dbase + L.k(g);
        float* dv = dbase + L.v(g);
        for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
          const int64_t c1 = std::min(c0 + kBlock, T);
          if (c1 < T) {
            gemm(true, false, c1 - c0, HS, T - c1, scale, dS + c1 * T + c0, T, base + c1 * L.row + L.q(h),
                 L.row, beta, dk + c0 * L.row, L.row);
            gemm(true, false, c1 - c0, HS, T - c1, 1.0f, A + c1 * T + c0, T, dy + c1 * ldo, ldo, beta,
                 dv + c0 * L.row, L.row);
          } else if (j == 0) {
            for (int64_t u = c0; u < c1; ++u) {
              std::fill(dk + u * L.row, dk + u * L.row + HS, 0.0f);
              std::fill(dv + u * L.row, dv + u * L.row + HS, 0.0f);
            }
          }
          for (int64_t u = c0; u < c1; ++u) {
            for (int64_t t = u; t < c1; ++t) {
              axpy(dk + u * L.row, scale * dS[t * T + u], base + t * L.row + L.q(h), HS);
              axpy(dv + u * L.row, A[t * T + u], dy + t * ldo, HS);
            }
          }
        }
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
