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

#include "kernels/cpu/attention_loops.hpp"
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


// A _rows call's query rows lie on the contract's chunks: T, first and count multiples of 64 (a
// chunk of a key's chain never spans two calls), first + count <= T.
void check_rows(AttentionShape s, QueryRows r, const char* op) {
  if (r.count == 0 && r.first == 0) return;
  LS_REQUIRE(r.first >= 0 && r.count > 0 && r.first + r.count <= s.T && r.first % kCanonicalChunk == 0 &&
                 r.count % kCanonicalChunk == 0 && s.T % kCanonicalChunk == 0,
             op, ": query rows [", r.first, ", ", r.first + r.count, ") of T = ", s.T,
             " must be a non-empty range whose ends and T are multiples of ", kCanonicalChunk);
}


// Offsets of the q, k and v heads inside a qkv row.
struct Layout {
  int64_t row, HS, NH, NKV;
  int64_t q(int64_t h) const { return h * HS; }
  int64_t k(int64_t g) const { return (NH + g) * HS; }
  int64_t v(int64_t g) const { return (NH + NKV + g) * HS; }
};
Layout layout_of(AttentionShape s) { return {(s.NH + 2 * s.NKV) * s.HS, s.HS, s.NH, s.NKV}; }

// The query rows of a call, [q0, q1) of each sequence: out, att, scratch, dout and dq hold n() rows
// a sequence, row t at t − q0; the keys read are [0, q1).
struct Rows {
  int64_t q0, q1;
  int64_t n() const { return q1 - q0; }
};
Rows rows_of(AttentionShape s, QueryRows r) { return r.count == 0 ? Rows{0, s.T} : Rows{r.first, r.first + r.count}; }

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
  // Adds the current chain's values, one chunk's partials, to acc at [at, at + n) (a _rows call's
  // exact key gradients) and starts a new chain.
  void add_to(ExactAccumulator& acc, int64_t at) {
    for (size_t d = 0; d < acc_.size(); ++d) acc.add(static_cast<size_t>(at) + d, acc_[d]);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  }
  // Rounds every combiner once and writes dst[d] = result · factor (one more fp32 rounding).
  void finish(float* dst, float factor) const {
    for (size_t d = 0; d < comb_.size(); ++d) dst[d] = comb_[d].finish() * factor;
  }

 private:
  std::vector<float> acc_;
  std::vector<ChunkCombiner> comb_;
};

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

// The canonical reduction of every row t in [r0, r1) (r0 a multiple of 8; x and y point at row
// r0, rows T apart) over [0, t]: groups of eight rows by canonical_rows8, the rows after the last
// whole group by canonical_sum / canonical_dot themselves.
template <bool kDot>
void canonical_rows(const float* x, const float* y, int64_t T, int64_t r0, int64_t r1, float* out) {
  int64_t t = r0;
  for (; t + 8 <= r1; t += 8) canonical_rows8<kDot>(x + (t - r0) * T, y + (t - r0) * T, T, t, out + (t - r0));
  for (; t < r1; ++t) {
    const float* xt = x + (t - r0) * T;
    out[t - r0] = kDot ? canonical_dot(xt, 1, y + (t - r0) * T, 1, t + 1) : canonical_sum(xt, 1, t + 1);
  }
}

// Rows [r0, r1) of one head's scores (A at row r0, row stride T; row t holds s[0..t] before the
// scale, r0 a multiple of 8) -> att = softmax over [0, t], 0 beyond:
//   s[t'] · scale;  m = max;  e[t'] = exp(s[t'] − m);  Z = canonical_sum of e;  att = e / Z
void softmax_rows_canonical(float* A, int64_t r0, int64_t r1, int64_t T, float scale) {
  float Z[kCanonicalChunk];
  for (int64_t t = r0; t < r1; ++t) {
    float* a = A + (t - r0) * T;
    for (int64_t u = 0; u <= t; ++u) a[u] = a[u] * scale;
    // a NaN score is skipped here but makes Z, so the row, NaN
    exp_row(a, t + 1, simd::first_max(a, t + 1));
  }
  canonical_rows<false>(A, A, T, r0, r1, Z);  // y is not read by a plain sum
  for (int64_t t = r0; t < r1; ++t) {
    float* a = A + (t - r0) * T;
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
void forward_canonical(AttentionShape s, Rows q, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS, n = q.n();
  const float scale = attention_scale(HS);
#pragma omp parallel
  {
    VectorReduction red(HS);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        const int64_t g = h / group;
        const float* base = qkv + b * T * L.row;
        float* A = att + (b * s.NH + h) * n * T;  // row t of this head at A + (t − q0)·T
        const bool v_finite = head_finite(base, L.row, L.v(g), q.q1, HS);
        for (int64_t r0 = q.q0; r0 < q.q1; r0 += kCanonicalChunk) {
          const int64_t r1 = std::min(r0 + kCanonicalChunk, q.q1);
          float* Ar = A + (r0 - q.q0) * T;
          float* o = out + (b * n + r0 - q.q0) * ldo + h * HS;
          // s[t, t'] = canonical_dot over HS of q[t]·k[t'], for t' < r1
          matmul_canonical(r1 - r0, r1, HS, Ar, T, base + r0 * L.row + L.q(h), L.row, 1, base + L.k(g), 1, L.row);
          softmax_rows_canonical(Ar, r0, r1, T, scale);
          // out[t] = canonical_dot over t' in [0, t] of att[t']·v[t']
          if (v_finite) {
            matmul_canonical(r1 - r0, HS, r1, o, ldo, Ar, T, 1, base + L.v(g), L.row, 1);
            continue;
          }
          for (int64_t t = r0; t < r1; ++t) {
            red.start();
            for (int64_t u = 0; u <= t; ++u) {
              fma_link(red.acc(), Ar[(t - r0) * T + u], base + u * L.row + L.v(g), HS);
              if ((u + 1) % kCanonicalChunk == 0) red.end_chunk();
            }
            if ((t + 1) % kCanonicalChunk != 0) red.end_chunk();
            red.finish(o + (t - r0) * ldo, 1.0f);
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

void forward_fast(AttentionShape s, Rows q, float* out, float* att, const float* qkv) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS, n = q.n();
  const float scale = attention_scale(HS);
  BlasSerial serial;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * L.row;
      float* A = att + (b * s.NH + h) * n * T;  // row t at A + (t − q0)·T
      float* o = out + b * n * ldo + h * HS;    // row t at o + (t − q0)·ldo
      const bool v_finite = head_finite(base, L.row, L.v(g), q.q1, HS);
      for (int64_t r0 = q.q0; r0 < q.q1; r0 += kBlock) {
        const int64_t r1 = std::min(r0 + kBlock, q.q1);
        float* Ar = A + (r0 - q.q0) * T;
        float* orow = o + (r0 - q.q0) * ldo;
        // s[t, t'] = (q[t]·k[t'])·scale for t' < r1 (the masked ones are overwritten below)
        sgemm_serial(false, true, r1 - r0, r1, HS, scale, base + r0 * L.row + L.q(h), L.row,
                     base + L.k(g), L.row, 0.0f, Ar, T);
        for (int64_t t = r0; t < r1; ++t) softmax_row_fast(Ar + (t - r0) * T, t, T);
        if (v_finite) {
          // out[t] = Σ_{t' < r1} att[t, t']·v[t'], the masked att[t, t' > t] being +0
          sgemm_serial(false, false, r1 - r0, HS, r1, 1.0f, Ar, T, base + L.v(g), L.row, 0.0f, orow, ldo);
          continue;
        }
        // out[t] = Σ_{t' <= t} att[t, t']·v[t']: keys before the block by sgemm, then the diagonal
        if (r0 > 0) {
          sgemm_serial(false, false, r1 - r0, HS, r0, 1.0f, Ar, T, base + L.v(g), L.row, 0.0f, orow, ldo);
        } else {
          for (int64_t t = r0; t < r1; ++t) std::fill(orow + (t - r0) * ldo, orow + (t - r0) * ldo + HS, 0.0f);
        }
        for (int64_t t = r0; t < r1; ++t) {
          add_weighted_rows(orow + (t - r0) * ldo, Ar + (t - r0) * T + r0, 1, base + r0 * L.row + L.v(g), L.row,
                            t - r0 + 1, HS);
        }
      }
    }
  }
}

// Canonical: ds = att·(datt − D) into scratch, per (b, h) row; the rows of datt by
// matmul_canonical on blocks of rows (masked entries overwritten, as the forward's scores), D by
// canonical_dot, eight rows side by side (canonical_rows).
void softmax_backward_rows_canonical(AttentionShape s, Rows q, float* scratch, const float* dout,
                                     const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS, n = q.n();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / group;
      const float* base = qkv + b * T * L.row;
      for (int64_t r0 = q.q0; r0 < q.q1; r0 += kCanonicalChunk) {
        const int64_t r1 = std::min(r0 + kCanonicalChunk, q.q1);
        const float* A = att + ((b * s.NH + h) * n + r0 - q.q0) * T;  // row r0
        float* dS = scratch + ((b * s.NH + h) * n + r0 - q.q0) * T;
        // datt[t,t'] = canonical_dot over HS of dout[t]·v[t']   (forward: out[t] = Σ att[t']·v[t'])
        matmul_canonical(r1 - r0, r1, HS, dS, T, dout + (b * n + r0 - q.q0) * ldo + h * HS, ldo, 1,
                         base + L.v(g), 1, L.row);
        // D[t] = canonical_dot over t' <= t of att[t,t']·datt[t,t']
        float D[kCanonicalChunk];
        canonical_rows<true>(A, dS, T, r0, r1, D);
        for (int64_t t = r0; t < r1; ++t) {
          const float* a = A + (t - r0) * T;
          float* ds = dS + (t - r0) * T;
          // ds[t,t'] = att[t,t']·(datt[t,t'] − D[t])      (forward: att = exp(s − m) / Z)
          for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D[t - r0]);
          for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
        }
      }
    }
  }
}

// dq over the query rows; dk and dv either rounded into dqkv (the whole op: keys == nullptr) or, for
// a _rows call, as exact sums of this call's chunk partials into keys->exact (unscaled).
void backward_canonical(AttentionShape s, Rows q, float* dq_rows, const KeyGrads* keys, float* scratch,
                        const float* dout, const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS, n = q.n();
  const float scale = attention_scale(HS);
  softmax_backward_rows_canonical(s, q, scratch, dout, qkv, att);
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
        const float* dS = scratch + (b * s.NH + h) * n * T;  // row t at dS + (t − q0)·T
        float* dq = dq_rows + b * n * L.row + L.q(h);         // row t at dq + (t − q0)·row
        if (head_finite(base, L.row, L.k(g), q.q1, HS)) {
          for (int64_t r0 = q.q0; r0 < q.q1; r0 += kCanonicalChunk) {
            const int64_t r1 = std::min(r0 + kCanonicalChunk, q.q1);
            matmul_canonical(r1 - r0, HS, r1, dq + (r0 - q.q0) * L.row, L.row, dS + (r0 - q.q0) * T, T, 1,
                             base + L.k(g), L.row, 1);
            scale_rows(dq, r0 - q.q0, r1 - q.q0);
          }
          continue;
        }
        for (int64_t t = q.q0; t < q.q1; ++t) {
          red_k.start();
          for (int64_t u = 0; u <= t; ++u) {
            fma_link(red_k.acc(), dS[(t - q.q0) * T + u], base + u * L.row + L.k(g), HS);
            if ((u + 1) % kCanonicalChunk == 0) red_k.end_chunk();
          }
          if ((t + 1) % kCanonicalChunk != 0) red_k.end_chunk();
          red_k.finish(dq + (t - q.q0) * L.row, scale);
        }
      }
    }
    // dk[t'] = (Σ ds[t,t']·q[t]) · scale and dv[t'] = Σ att[t,t']·dout[t] over the pairs (j, t),
    // t >= t', in the order i = j·T + t, chunk = ⌊i / 64⌋ (the header's contract). Pairs with
    // t < t' are not links of the chain; chunks that hold none of them close with a +0 partial.
    //   (forward: s[t'] = (q[t]·k[t'])·scale and out[t] = Σ att[t,t']·v[t'])
    // With finite q and dout, by matmul_canonical (one query head per group, i = t) or
    // matmul_chunks_exact (a _rows call, each query head j in turn: its chunks are those of i)
    // over t >= c0 for the keys [c0, c1) (c0 a multiple of 64, so the chunks are the contract's;
    // the chunks before c0 hold no pair and would add +0; the masked ds and att entries are +0 as
    // in the forward).
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t g = 0; g < s.NKV; ++g) {
        const float* base = qkv + b * T * L.row;
        const float* dy = dout + b * n * ldo;  // row t at dy + (t − q0)·ldo
        bool finite = head_finite(dy, ldo, g * group * HS, n, group * HS);
        for (int64_t j = 0; j < group && finite; ++j) finite = head_finite(base + q.q0 * L.row, L.row, L.q(g * group + j), n, HS);
        if (keys != nullptr && finite) {
          // exact sums at [dk | dv], each (B, NKV, T, HS)
          const int64_t dk_at = (b * s.NKV + g) * T * HS, dv_at = dk_at + s.B * s.NKV * T * HS;
          for (int64_t j = 0; j < group; ++j) {
            const int64_t h = g * group + j;
            const float* dS = scratch + (b * s.NH + h) * n * T;
            const float* A = att + (b * s.NH + h) * n * T;
            for (int64_t c0 = 0; c0 < q.q1; c0 += kCanonicalChunk) {
              const int64_t c1 = std::min(c0 + kCanonicalChunk, q.q1), t0 = std::max(c0, q.q0);
              matmul_chunks_exact(c1 - c0, HS, q.q1 - t0, *keys->exact, dk_at + c0 * HS, dS + (t0 - q.q0) * T + c0, 1, T,
                                  base + t0 * L.row + L.q(h), L.row, 1);
              matmul_chunks_exact(c1 - c0, HS, q.q1 - t0, *keys->exact, dv_at + c0 * HS, A + (t0 - q.q0) * T + c0, 1, T,
                                  dy + (t0 - q.q0) * ldo + h * HS, ldo, 1);
            }
          }
          continue;
        }
        if (keys != nullptr) {
          // Non-finite operands: the chains one link at a time, each pair's chunk partial exact.
          const int64_t dk_at = (b * s.NKV + g) * T * HS, dv_at = dk_at + s.B * s.NKV * T * HS;
          red_k.start();
          red_v.start();
          for (int64_t u = 0; u < q.q1; ++u) {
            for (int64_t j = 0; j < group; ++j) {
              const int64_t h = g * group + j;
              for (int64_t c0 = std::max(q.q0, u / kCanonicalChunk * kCanonicalChunk); c0 < q.q1; c0 += kCanonicalChunk) {
                for (int64_t t = std::max(c0, u); t < c0 + kCanonicalChunk; ++t) {
                  const int64_t at = ((b * s.NH + h) * n + t - q.q0) * T + u;
                  fma_link(red_k.acc(), scratch[at], base + t * L.row + L.q(h), HS);
                  fma_link(red_v.acc(), att[at], dy + (t - q.q0) * ldo + h * HS, HS);
                }
                red_k.add_to(*keys->exact, dk_at + u * HS);
                red_v.add_to(*keys->exact, dv_at + u * HS);
              }
            }
          }
          continue;
        }
        float* dk = dq_rows + b * T * L.row + L.k(g);
        float* dv = dq_rows + b * T * L.row + L.v(g);
        if (group == 1 && finite) {
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

// dq over the query rows; dk and dv into dqkv (the whole op: keys == nullptr, dk scaled) or, for a
// _rows call, this call's sums added to keys->partial (unscaled).
void backward_fast(AttentionShape s, Rows q, float* dq_rows, const KeyGrads* keys, float* scratch,
                   const float* dout, const float* qkv, const float* att) {
  const Layout L = layout_of(s);
  const int64_t group = s.NH / s.NKV, T = s.T, HS = s.HS, ldo = s.NH * HS, n = q.n();
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
      float* dq_base = dq_rows + b * n * L.row;  // row t at (t − q0)·row
      // dk and dv of key u at dk + u·ld, dv + u·ld
      const int64_t ld = keys != nullptr ? HS : L.row;
      float* dk = keys != nullptr ? keys->partial + (b * s.NKV + g) * T * HS : dq_rows + b * T * L.row + L.k(g);
      float* dv = keys != nullptr ? dk + s.B * s.NKV * T * HS : dq_rows + b * T * L.row + L.v(g);
      const bool k_finite = head_finite(base, L.row, L.k(g), q.q1, HS);
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = g * group + j;
        const float* A = att + (b * s.NH + h) * n * T;  // row t at (t − q0)·T
        float* dS = scratch + (b * s.NH + h) * n * T;
        const float* dy = dout + b * n * ldo + h * HS;  // row t at (t − q0)·ldo
        const bool add = keys != nullptr || j > 0;  // to dk and dv
        const float beta = add ? 1.0f : 0.0f;
        const bool q_finite = head_finite(base + q.q0 * L.row, L.row, L.q(h), n, HS);
        const bool dy_finite = head_finite(dy, ldo, 0, n, HS);
        for (int64_t r0 = q.q0; r0 < q.q1; r0 += kBlock) {
          const int64_t r1 = std::min(r0 + kBlock, q.q1);
          float* dSr = dS + (r0 - q.q0) * T;
          // datt[t, t'] = dout[t]·v[t'] for t' < r1   (forward: out[t] = Σ att[t, t']·v[t'])
          sgemm_serial(false, true, r1 - r0, r1, HS, 1.0f, dy + (r0 - q.q0) * ldo, ldo, base + L.v(g), L.row, 0.0f,
                       dSr, T);
          // ds = att·(datt − D), D[t] = Σ_{t' <= t} att·datt   (forward: att = exp(s − m) / Z)
          for (int64_t t = r0; t < r1; ++t) {
            const float* a = A + (t - q.q0) * T;
            float* ds = dS + (t - q.q0) * T;
            const float D = dot_any_order(a, ds, t + 1);
            for (int64_t u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - D);
            for (int64_t u = t + 1; u < T; ++u) ds[u] = 0.0f;
          }
          // dq[t] = scale·Σ_{t' <= t} ds[t, t']·k[t']   (forward: s = (q·k)·scale)
          float* dq = dq_base + L.q(h) + (r0 - q.q0) * L.row;  // row r0
          if (k_finite) {
            // over the diagonal block too: the masked ds[t, t' > t] are +0 (see forward_fast)
            sgemm_serial(false, false, r1 - r0, HS, r1, 1.0f, dSr, T, base + L.k(g), L.row, 0.0f, dq, L.row);
            for (int64_t t = 0; t < r1 - r0; ++t) {
              for (int64_t d = 0; d < HS; ++d) dq[t * L.row + d] *= scale;
            }
            continue;
          }
          if (r0 > 0) {
            sgemm_serial(false, false, r1 - r0, HS, r0, 1.0f, dSr, T, base + L.k(g), L.row, 0.0f, dq, L.row);
          } else {
            for (int64_t t = 0; t < r1 - r0; ++t) std::fill(dq + t * L.row, dq + t * L.row + HS, 0.0f);
          }
          for (int64_t t = r0; t < r1; ++t) {
            float* dqt = dq + (t - r0) * L.row;
            add_weighted_rows(dqt, dSr + (t - r0) * T + r0, 1, base + r0 * L.row + L.k(g), L.row, t - r0 + 1, HS);
            for (int64_t d = 0; d < HS; ++d) dqt[d] *= scale;
          }
        }
        // dk[t'] = scale·Σ_{t >= t'} ds[t, t']·q[t] and dv[t'] = Σ_{t >= t'} att[t, t']·dout[t], by
        // blocks of keys [c0, c1): dst[t'] (+)= Σ_t W[t, t']·x[t] over the query rows (W's row t at
        // (t − q0)·T, x's at (t − q0)·sx). Keys before the rows meet no masked entry: one sgemm. With
        // x finite over the rows, one sgemm over the queries from c0 (the masked W[t, t' > t] of the
        // diagonal block are +0, see forward_fast); otherwise the queries after the block by sgemm,
        // then the diagonal.
        auto key_block = [&](float* dst, const float* W, const float* x, int64_t sx, bool x_finite, int64_t c0,
                             int64_t c1) {
          const int64_t t0 = std::max(c0, q.q0);
          if (x_finite || c1 <= q.q0) {
            sgemm_serial(true, false, c1 - c0, HS, q.q1 - t0, 1.0f, W + (t0 - q.q0) * T + c0, T, x + (t0 - q.q0) * sx, sx,
                         beta, dst + c0 * ld, ld);
            return;
          }
          if (c1 < q.q1) {
            sgemm_serial(true, false, c1 - c0, HS, q.q1 - c1, 1.0f, W + (c1 - q.q0) * T + c0, T, x + (c1 - q.q0) * sx, sx,
                         beta, dst + c0 * ld, ld);
          } else if (!add) {
            for (int64_t u = c0; u < c1; ++u) std::fill(dst + u * ld, dst + u * ld + HS, 0.0f);
          }
          for (int64_t u = c0; u < c1; ++u) {
            add_weighted_rows(dst + u * ld, W + (u - q.q0) * T + u, T, x + (u - q.q0) * sx, sx, c1 - u, HS);
          }
        };
        for (int64_t c0 = 0; c0 < q.q1; c0 += kBlock) {
          const int64_t c1 = std::min(c0 + kBlock, q.q1);
          key_block(dk, dS, base + q.q0 * L.row + L.q(h), L.row, q_finite, c0, c1);
          key_block(dv, A, dy, ldo, dy_finite, c0, c1);
        }
      }
      if (keys != nullptr) continue;
      for (int64_t u = 0; u < T; ++u) {
        for (int64_t d = 0; d < HS; ++d) dk[u * L.row + d] *= scale;
      }
    }
  }
}

}  // namespace

void attention_forward(Mode mode, AttentionShape s, float* out, float* att, const float* qkv) {
  attention_forward_rows(mode, s, {}, out, att, qkv);
}

void attention_backward(Mode mode, AttentionShape s, float* dqkv, float* scratch,
                        const float* dout, const float* qkv, const float* att) {
  check_shape(s, "attention_backward");
  const Rows all{0, s.T};
  if (mode == Mode::kCanonical) {
    backward_canonical(s, all, dqkv, nullptr, scratch, dout, qkv, att);
  } else {
    backward_fast(s, all, dqkv, nullptr, scratch, dout, qkv, att);
  }
}

void attention_forward_rows(Mode mode, AttentionShape s, QueryRows rows, float* out, float* att, const float* qkv) {
  check_shape(s, "attention_forward");
  check_rows(s, rows, "attention_forward_rows");
  if (mode == Mode::kCanonical) {
    forward_canonical(s, rows_of(s, rows), out, att, qkv);
  } else {
    forward_fast(s, rows_of(s, rows), out, att, qkv);
  }
}

void attention_backward_rows(Mode mode, AttentionShape s, QueryRows rows, float* dq, KeyGrads keys, float* scratch,
                             const float* dout, const float* qkv, const float* att) {
  check_shape(s, "attention_backward_rows");
  check_rows(s, rows, "attention_backward_rows");
  LS_REQUIRE(mode == Mode::kCanonical ? keys.exact != nullptr : keys.partial != nullptr,
             "attention_backward_rows: ", mode == Mode::kCanonical ? "canonical mode needs KeyGrads::exact"
                                                                   : "fast mode needs KeyGrads::partial");
  if (mode == Mode::kCanonical) {
    backward_canonical(s, rows_of(s, rows), dq, &keys, scratch, dout, qkv, att);
  } else {
    backward_fast(s, rows_of(s, rows), dq, &keys, scratch, dout, qkv, att);
  }
}

}  // namespace lockstep::cpu
