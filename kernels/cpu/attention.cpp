// Causal self-attention with grouped key/value heads on the CPU: forward and backward, canonical
// and fast modes (contract in kernels/ops/attention.hpp).
//
// Canonical mode follows the header's reductions. The products (scores, datt, and out, dq, dk, dv
// where their operands are finite and, for dk/dv, each group has one query head) run as
// matmul_canonical, the packed SIMD kernel whose every element is bitwise canonical_dot, on blocks
// of 64 rows (forward_canonical says why the masked entries do not change a bit). Otherwise the
// vector reductions run HS chains side by side, one chain per output element, each chunk of 64
// reduction indices ending with its HS partials going into HS exact combiners (canonical.hpp).
// The softmax's Z and the backward's D = Σ att·datt are reduced eight query rows at a time, each
// row's chains in one lane of a vector (canonical_rows8: the same chains, side by side).
// Threads take whole (b, h) pairs — (b, g) pairs for dk/dv — never part of a reduction, so the
// bits do not depend on the thread count.
// Fast mode: sgemm (OpenBLAS, or matmul_fast: sgemm_threads.hpp) over blocks of rows, softmax
// with the 8-lane ls_expf (forward_fast).
//
// Not here: RoPE (rope.cpp), the QKV and output projections (linear.cpp), flash-style tiling
// (the (B, NH, T, T) probabilities are materialised and cached for backward, as in llm.c).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/linear.hpp"
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

// Whether rows [0, T) of one head (HS wide, row stride `row`) hold only finite values. x·0 is ±0
// for a finite x and NaN for ±inf and NaN, so the sum of all x·0 is 0 exactly when every x is
// finite: 8 lanes with no branch per element (fast mode asks this of every head it multiplies).
bool head_finite(const float* base, int64_t row, int64_t offset, int64_t T, int64_t HS) {
  const int64_t hv = HS / 8 * 8;
  const __m256 zero = _mm256_setzero_ps();
  __m256 lanes = zero;
  float tail = 0.0f;
  for (int64_t u = 0; u < T; ++u) {
    const float* x = base + u * row + offset;
    for (int64_t d = 0; d < hv; d += 8) lanes = _mm256_add_ps(lanes, _mm256_mul_ps(_mm256_loadu_ps(x + d), zero));
    for (int64_t d = hv; d < HS; ++d) tail = tail + x[d] * 0.0f;
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, lanes);
  for (float l : sums) tail = tail + l;
  return tail == 0.0f;
}

// out[j] = canonical_sum over u in [0, t0 + j] of x[j·T + u] (kDot: canonical_dot of the rows of
// x and y) for j < 8, t0 a multiple of 8: the eight rows' chains run side by side, one per lane
// (simd::load_transposed8), over their common part [0, t0), closing their chunks together at
// multiples of 64; each row then finishes its own chain over [t0, t0 + j] alone. Every row gets
// the additions of its own chain in its own order: canonical_sum's (canonical_dot's) bits.
template <bool kDot>
void canonical_rows8(const float* x, const float* y, int64_t T, int64_t t0, float* out) {
  ChunkCombiner comb[8];
  simd::V8 acc = _mm256_setzero_ps();
  alignas(32) float lane[8];
  for (int64_t u = 0; u < t0; u += 8) {
    simd::V8 xr[8], yr[8];
    simd::load_transposed8(x + u, T, xr);
    if constexpr (kDot) simd::load_transposed8(y + u, T, yr);
    for (int k = 0; k < 8; ++k) acc = kDot ? _mm256_fmadd_ps(xr[k], yr[k], acc) : _mm256_add_ps(acc, xr[k]);
    if ((u + 8) % kCanonicalChunk == 0) {
      _mm256_store_ps(lane, acc);
      for (int j = 0; j < 8; ++j) comb[j].add(lane[j]);
      acc = _mm256_setzero_ps();  // the next chunk's chains start from +0
    }
  }
  _mm256_store_ps(lane, acc);
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + j * T;
    const float* yj = y + j * T;
    float a = lane[j];
    for (int64_t u = t0; u <= t0 + j; ++u) a = kDot ? std::fma(xj[u], yj[u], a) : a + xj[u];
    comb[j].add(a);
    out[j] = comb[j].finish();
  }
}

// The canonical reduction of every row t in [r0, r1) (r0 a multiple of 8) over [0, t]: groups of
// eight rows by canonical_rows8, the rows after the last whole group by canonical_sum /
// canonical_dot themselves.
template <bool kDot>
void canonical_rows(const float* x, const float* y, int64_t T, int64_t r0, int64_t r1, float* out) {
  int64_t t = r0;
  for (; t + 8 <= r1; t += 8) canonical_rows8<kDot>(x + t * T, y + t * T, T, t, out + (t - r0));
  for (; t < r1; ++t) {
    out[t - r0] = kDot ? canonical_dot(x + t * T, 1, y + t * T, 1, t + 1) : canonical_sum(x + t * T, 1, t + 1);
  }
}

// Rows [r0, r1) of one head's scores (row stride T; row t holds s[0..t] before the scale, r0 a
// multiple of 8) -> att = softmax over [0, t], 0 beyond:
//   s[t'] · scale;  m = max;  e[t'] = exp(s[t'] − m);  Z = canonical_sum of e;  att = e / Z
void softmax_rows_canonical(float* A, int64_t r0, int64_t r1, int64_t T, float scale) {
  float Z[kCanonicalChunk];
  for (int64_t t = r0; t < r1; ++t) {
    float* a = A + t * T;
    for (int64_t u = 0; u <= t; ++u) a[u] = a[u] * scale;
    // a NaN score is skipped here but makes Z, so the row, NaN
    const float m = simd::first_max(a, t + 1);
    const int64_t nv = (t + 1) / 8 * 8;
    for (int64_t u = 0; u < nv; u += 8) {
      _mm256_storeu_ps(a + u, simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(a + u), simd::set1(m))));
    }
    for (int64_t u = nv; u <= t; ++u) a[u] = ls_expf(a[u] - m);
  }
  canonical_rows<false>(A, A, T, r0, r1, Z);  // y is not read by a plain sum
  for (int64_t t = r0; t < r1; ++t) {
    float* a = A + t * T;
    const float z = Z[t - r0];
    for (int64_t u = 0; u <= t; ++u) a[u] = a[u] / z;
    for (int64_t u = t + 1; u < T; ++u) a[u] = 0.0f;
  }
}

// Canonical products as matmul_canonical (the packed SIMD kernel, bitwise canonical_dot per
// element) on blocks of kCanonicalChunk query rows [r0, r1), each over the keys t' < r1: the
// scores of a row t and its masked keys t' in (t, r1) are computed and then overwritten by 0; a sum
// over t' (out, dq) then runs over those zeros as well, which leaves each chain's value unchanged
// (x + (±0) = x, and the exact combination turns a −0 partial into +0 just as a shorter chain
// would end) — unless the other factor is inf or NaN, where 0·inf = NaN. Those sums therefore
// take this path only when the head's operands are all finite, else the per-row chains below.
// Blocks start at multiples of 64, so every chunk of a chain is the contract's chunk.
void forward_canonical(AttentionShape s, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS;
  const float scale = attention_scale(HS);
#pragma omp parallel
  {
    VectorReduction red(HS);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        float* A = att + (b * s.NH + h) * T * T;
        const bool v_finite = head_finite(base, L.row, L.v(g), T, HS);
        for (int64_t r0 = 0; r0 < T; r0 += kCanonicalChunk) {
          const int64_t r1 = std::min(r0 + kCanonicalChunk, T);
          // s[t, t'] = canonical_dot over HS of q[t]·k[t'], for t' < r1
          matmul_canonical(r1 - r0, r1, HS, A + r0 * T, T, base + r0 * L.row + L.q(h), L.row, 1,
                           base + L.k(g), 1, L.row);
          softmax_rows_canonical(A, r0, r1, T, scale);
          // out[t] = canonical_dot over t' in [0, t] of att[t']·v[t']
          if (v_finite) {
            matmul_canonical(r1 - r0, HS, r1, out + (b * T + r0) * ldo + h * HS, ldo, A + r0 * T, T, 1,
                             base + L.v(g), L.row, 1);
            continue;
          }
          for (int64_t t = r0; t < r1; ++t) {
            red.start();
            for (int64_t u = 0; u <= t; ++u) {
              fma_link(red.acc(), A[t * T + u], base + u * L.row + L.v(g), HS);
              if ((u + 1) % kCanonicalChunk == 0) red.end_chunk();
            }
            if ((t + 1) % kCanonicalChunk != 0) red.end_chunk();
            red.finish(out + (b * T + t) * ldo + h * HS, 1.0f);
          }
        }
      }
    }
  }
}

// Fast mode: per (b, h) the products run as sgemm_serial on blocks of kBlock query rows, each
// over the keys it can see. Inside the diagonal block a row t also meets keys t' > t: their scores
// are computed and then overwritten by the masked 0. Where the other factor of a product that sums
// over those zeros (att·v, ds·k, ds·q, att·dout) is finite in the whole head, the sgemm runs over
// the diagonal block too: a masked term adds an exact ±0, which neither rounds nor changes a
// partial sum, so the result is a sum of the visible terms in some order (the bound's). Otherwise
// the diagonal block runs as explicit loops over t' <= t only, so a non-finite value in a masked
// position never reaches a result (0·inf would be NaN). Threads take (b, h) pairs with OpenBLAS
// single-threaded inside (see BlasSerial); softmax is 8 lanes wide (simd_math).
constexpr int64_t kBlock = 64;

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
  simd::V8 acc = _mm256_setzero_ps();
  for (int64_t u = 0; u < nv; u += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + u), _mm256_loadu_ps(y + u), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (int64_t u = nv; u < n; ++u) sum = std::fma(x[u], y[u], sum);
  return sum;
}

// Row t of the scores, a[0..t] on entry: a = softmax(a) over [0, t], a[t'] = 0 beyond (to T).
void softmax_row_fast(float* a, int64_t t, int64_t T) {
  const int64_t n = t + 1, nv = n / 8 * 8;
  // The max in 8 lanes (a scalar max chain waits on each compare): _mm256_max_ps(x, y) is
  // x > y ? x : y per lane, so a NaN score is skipped here as well, and makes Z, so the row, NaN.
  simd::V8 lane_max = simd::set1(-INFINITY);
  for (int64_t u = 0; u < nv; u += 8) lane_max = _mm256_max_ps(_mm256_loadu_ps(a + u), lane_max);
  alignas(32) float maxima[8];
  _mm256_store_ps(maxima, lane_max);
  float m = -INFINITY;
  for (float l : maxima) m = l > m ? l : m;
  for (int64_t u = nv; u < n; ++u) m = a[u] > m ? a[u] : m;
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
      const bool v_finite = head_finite(base, L.row, L.v(g), T, HS);
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(r0 + kBlock, T);
        // s[t, t'] = (q[t]·k[t'])·scale for t' < r1 (the masked ones are overwritten below)
        sgemm_serial(false, true, r1 - r0, r1, HS, scale, base + r0 * L.row + L.q(h), L.row,
                     base + L.k(g), L.row, 0.0f, A + r0 * T, T);
        for (int64_t t = r0; t < r1; ++t) softmax_row_fast(A + t * T, t, T);
        if (v_finite) {
          // out[t] = Σ_{t' < r1} att[t, t']·v[t'], the masked att[t, t' > t] being +0
          sgemm_serial(false, false, r1 - r0, HS, r1, 1.0f, A + r0 * T, T, base + L.v(g), L.row, 0.0f,
                       o + r0 * ldo, ldo);
          continue;
        }
        // out[t] = Σ_{t' <= t} att[t, t']·v[t']: keys before the block by sgemm, then the diagonal
        if (r0 > 0) {
          sgemm_serial(false, false, r1 - r0, HS, r0, 1.0f, A + r0 * T, T, base + L.v(g), L.row, 0.0f,
                       o + r0 * ldo, ldo);
        } else {
          for (int64_t t = r0; t < r1; ++t) std::fill(o + t * ldo, o + t * ldo + HS, 0.0f);
        }
        for (int64_t t = r0; t < r1; ++t) {
          add_weighted_rows(o + t * ldo, A + t * T + r0, 1, base + r0 * L.row + L.v(g), L.row, t - r0 + 1, HS);
        }
      }
    }
  }
}

// Canonical: ds = att·(datt − D) into scratch, per (b, h) row; the rows of datt by
// matmul_canonical on blocks of rows (masked entries overwritten, as the forward's scores), D by
// canonical_dot, eight rows side by side (canonical_rows).
void softmax_backward_rows_canonical(AttentionShape s, float* scratch, const float* dout,
                                     const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * L.row;
      const float* A = att + (b * s.NH + h) * T * T;
      float* dS = scratch + (b * s.NH + h) * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += kCanonicalChunk) {
        const int64_t r1 = std::min(r0 + kCanonicalChunk, T);
        // datt[t,t'] = canonical_dot over HS of dout[t]·v[t']   (forward: out[t] = Σ att[t']·v[t'])
        matmul_canonical(r1 - r0, r1, HS, dS + r0 * T, T, dout + (b * T + r0) * ldo + h * HS, ldo, 1,
                         base + L.v(g), 1, L.row);
        // D[t] = canonical_dot over t' <= t of att[t,t']·datt[t,t']
        float D[kCanonicalChunk];
        canonical_rows<true>(A, dS, T, r0, r1, D);
        for (int64_t t = r0; t < r1; ++t) {
          const float* a = A + t * T;
          float* ds = dS + t * T;
          // ds[t,t'] = att[t,t']·(datt[t,t'] − D[t])      (forward: att = exp(s − m) / Z)
          for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D[t - r0]);
          for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
        }
      }
    }
  }
}

void backward_canonical(AttentionShape s, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS;
  const float scale = attention_scale(HS);
  softmax_backward_rows_canonical(s, scratch, dout, qkv, att);
  // rows[r0, r1) of a (·, HS) block at stride `row` times scale, one fp32 rounding each
  auto scale_rows = [&](float* x, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t d = 0; d < HS; ++d) x[r * L.row + d] = x[r * L.row + d] * scale;
    }
  };
#pragma omp parallel
  {
    VectorReduction red_k(HS), red_v(HS);
    // dq[t] = (canonical_dot over t' <= t of ds[t,t']·k[t']) · scale
    //   (forward: s[t'] = (q[t]·k[t']) · scale)
    // By matmul_canonical on blocks of rows when the keys are finite (see forward_canonical).
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        const float* dS = scratch + (b * s.NH + h) * T * T;
        float* dq = dqkv + b * T * L.row + L.q(h);
        if (head_finite(base, L.row, L.k(g), T, HS)) {
          for (int64_t r0 = 0; r0 < T; r0 += kCanonicalChunk) {
            const int64_t r1 = std::min(r0 + kCanonicalChunk, T);
            matmul_canonical(r1 - r0, HS, r1, dq + r0 * L.row, L.row, dS + r0 * T, T, 1, base + L.k(g), L.row, 1);
            scale_rows(dq, r0, r1);
          }
          continue;
        }
        for (int64_t t = 0; t < T; ++t) {
          red_k.start();
          for (int64_t u = 0; u <= t; ++u) {
            fma_link(red_k.acc(), dS[t * T + u], base + u * L.row + L.k(g), HS);
            if ((u + 1) % kCanonicalChunk == 0) red_k.end_chunk();
          }
          if ((t + 1) % kCanonicalChunk != 0) red_k.end_chunk();
          red_k.finish(dq + t * L.row, scale);
        }
      }
    }
    // dk[t'] = (Σ ds[t,t']·q[t]) · scale and dv[t'] = Σ att[t,t']·dout[t] over the pairs (j, t),
    // t >= t', in the order i = j·T + t, chunk = ⌊i / 64⌋ (the header's contract). Pairs with
    // t < t' are not links of the chain; chunks that hold none of them close with a +0 partial.
    //   (forward: s[t'] = (q[t]·k[t'])·scale and out[t] = Σ att[t,t']·v[t'])
    // One query head per group (i = t) with finite q and dout: matmul_canonical over t >= c0 for
    // the keys [c0, c1) (c0 a multiple of 64, so the chunks are the contract's; the chunks before
    // c0 hold no pair and would add +0; the masked ds and att entries are +0 as in the forward).
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t g = 0; g < s.NKV; ++g) {
        const float* base = qkv + b * T * L.row;
        float* dk = dqkv + b * T * L.row + L.k(g);
        float* dv = dqkv + b * T * L.row + L.v(g);
        if (group == 1 && head_finite(base, L.row, L.q(g), T, HS) &&
            head_finite(dout + b * T * ldo, ldo, g * HS, T, HS)) {
          const float* dS = scratch + (b * s.NH + g) * T * T;
          const float* A = att + (b * s.NH + g) * T * T;
          for (int64_t c0 = 0; c0 < T; c0 += kCanonicalChunk) {
            const int64_t c1 = std::min(c0 + kCanonicalChunk, T);
            matmul_canonical(c1 - c0, HS, T - c0, dk + c0 * L.row, L.row, dS + c0 * T + c0, 1, T,
                             base + c0 * L.row + L.q(g), L.row, 1);
            scale_rows(dk, c0, c1);
            matmul_canonical(c1 - c0, HS, T - c0, dv + c0 * L.row, L.row, A + c0 * T + c0, 1, T,
                             dout + (b * T + c0) * ldo + g * HS, ldo, 1);
          }
          continue;
        }
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
              fma_link(red_k.acc(), scratch[at], base + t * L.row + L.q(h), HS);
              fma_link(red_v.acc(), att[at], dout + (b * T + t) * ldo + h * HS, HS);
            }
            red_k.end_chunk();
            red_v.end_chunk();
          }
          red_k.finish(dk + u * L.row, scale);
          red_v.finish(dv + u * L.row, 1.0f);
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
  // turn, the first overwriting dk/dv (beta 0), the others adding. dq and dk are summed unscaled
  // and multiplied by the scale once at the end, as the reference evaluates (Σ ds·k)·scale:
  // scaling each ds first would add a rounding per term, which the bound does not allow for where
  // the terms are subnormal (attention scores in the hundreds).
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.NKV; ++g) {
      const float* base = qkv + b * T * L.row;
      float* dbase = dqkv + b * T * L.row;
      const bool k_finite = head_finite(base, L.row, L.k(g), T, HS);
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = g * group + j;
        const float* A = att + (b * s.NH + h) * T * T;
        float* dS = scratch + (b * s.NH + h) * T * T;
        const float* dy = dout + b * T * ldo + h * HS;
        const float beta = j == 0 ? 0.0f : 1.0f;
        const bool q_finite = head_finite(base, L.row, L.q(h), T, HS);
        const bool dy_finite = head_finite(dy, ldo, 0, T, HS);
        for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
          const int64_t r1 = std::min(r0 + kBlock, T);
          // datt[t, t'] = dout[t]·v[t'] for t' < r1   (forward: out[t] = Σ att[t, t']·v[t'])
          sgemm_serial(false, true, r1 - r0, r1, HS, 1.0f, dy + r0 * ldo, ldo, base + L.v(g), L.row, 0.0f,
                       dS + r0 * T, T);
          // ds = att·(datt − D), D[t] = Σ_{t' <= t} att·datt   (forward: att = exp(s − m) / Z)
          for (int64_t t = r0; t < r1; ++t) {
            const float* a = A + t * T;
            float* ds = dS + t * T;
            const float D = dot_any_order(a, ds, t + 1);
            for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D);
            for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
          }
          // dq[t] = scale·Σ_{t' <= t} ds[t, t']·k[t']   (forward: s = (q·k)·scale)
          float* dq = dbase + L.q(h);
          if (k_finite) {
            // over the diagonal block too: the masked ds[t, t' > t] are +0 (see forward_fast)
            sgemm_serial(false, false, r1 - r0, HS, r1, 1.0f, dS + r0 * T, T, base + L.k(g), L.row, 0.0f,
                         dq + r0 * L.row, L.row);
            for (int64_t t = r0; t < r1; ++t) {
              for (int64_t d = 0; d < HS; ++d) dq[t * L.row + d] *= scale;
            }
            continue;
          }
          if (r0 > 0) {
            sgemm_serial(false, false, r1 - r0, HS, r0, 1.0f, dS + r0 * T, T, base + L.k(g), L.row, 0.0f,
                         dq + r0 * L.row, L.row);
          } else {
            for (int64_t t = r0; t < r1; ++t) std::fill(dq + t * L.row, dq + t * L.row + HS, 0.0f);
          }
          for (int64_t t = r0; t < r1; ++t) {
            add_weighted_rows(dq + t * L.row, dS + t * T + r0, 1, base + r0 * L.row + L.k(g), L.row, t - r0 + 1, HS);
            for (int64_t d = 0; d < HS; ++d) dq[t * L.row + d] *= scale;
          }
        }
        // dk[t'] = scale·Σ_{t >= t'} ds[t, t']·q[t] and dv[t'] = Σ_{t >= t'} att[t, t']·dout[t], by
        // blocks of keys [c0, c1): dst[t'] (+)= Σ_t W[t, t']·x[t]. With x finite in the whole head,
        // one sgemm over the queries from c0 (the masked W[t, t' > t] of the diagonal block are +0,
        // see forward_fast); otherwise the queries after the block by sgemm, then the diagonal.
        auto key_block = [&](float* dst, const float* W, const float* x, int64_t sx, bool x_finite, int64_t c0,
                             int64_t c1) {
          if (x_finite) {
            sgemm_serial(true, false, c1 - c0, HS, T - c0, 1.0f, W + c0 * T + c0, T, x + c0 * sx, sx, beta,
                         dst + c0 * L.row, L.row);
            return;
          }
          if (c1 < T) {
            sgemm_serial(true, false, c1 - c0, HS, T - c1, 1.0f, W + c1 * T + c0, T, x + c1 * sx, sx, beta,
                         dst + c0 * L.row, L.row);
          } else if (j == 0) {
            for (int64_t u = c0; u < c1; ++u) std::fill(dst + u * L.row, dst + u * L.row + HS, 0.0f);
          }
          for (int64_t u = c0; u < c1; ++u) {
            add_weighted_rows(dst + u * L.row, W + u * T + u, T, x + u * sx, sx, c1 - u, HS);
          }
        };
        for (int64_t c0 = 0; c0 < T; c0 += kBlock) {
          const int64_t c1 = std::min(c0 + kBlock, T);
          key_block(dbase + L.k(g), dS, base + L.q(h), L.row, q_finite, c0, c1);
          key_block(dbase + L.v(g), A, dy, ldo, dy_finite, c0, c1);
        }
      }
      float* dk = dbase + L.k(g);
      for (int64_t u = 0; u < T; ++u) {
        for (int64_t d = 0; d < HS; ++d) dk[u * L.row + d] *= scale;
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
