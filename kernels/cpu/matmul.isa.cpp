// The canonical matrix product as a packed, register-blocked SIMD kernel; compiled once per ISA
// (kernels/CMakeLists.txt) into lockstep::cpu::avx2 and lockstep::cpu::avx512.
//
// Algorithm (matmul_packed_mrx2v):
//  - B is packed into panels of kNr = 2 vectors of columns, k-major (panel[k][j]); A into
//    micro-panels of kMr rows, k-major (panel[k][r]); edges are padded with zeros and the padded
//    results discarded. Packing absorbs any strides, so A or B may be transposed views.
//  - A kMr x kNr output tile keeps 2·kMr vector accumulators. Each SIMD lane is one output
//    element's sequential fp32 FMA chain over a chunk of 64 k's, started from +0.0f: exactly
//    chunk_dot of kernels/ops/canonical.hpp, so the bits do not depend on the vector width.
//  - At every chunk end the lane partials are widened to double and added to per-element double
//    sums. An addition t = s + p is exact iff (t − s) − p == 0 and (t − p) − s == 0 (for the
//    operand of larger magnitude the difference is computed exactly — Dekker's Fast2Sum lemma —
//    and differs from the other operand iff t is not s + p; a non-finite operand yields NaN or
//    inf). Every element whose sum was ever inexact, or met inf/NaN, is recomputed with the scalar
//    specification canonical_dot, which is bitwise what the vector path computes when its sums
//    are exact. Otherwise the exact double sum is rounded to fp32 once — ChunkCombiner's fast path.
//  - Threads split the output into tiles (OpenMP over tile indices); no sum crosses threads, so
//    the bits do not depend on the thread count either.
// Not here: dispatch (matmul.cpp), fast-mode products (OpenBLAS), the linear layer (linear.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul_isa.hpp"
#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"

#ifndef LS_ISA_NS
#error "matmul.isa.cpp is compiled once per ISA with -DLS_ISA_NS=avx2 or -DLS_ISA_NS=avx512"
#endif

namespace lockstep::cpu::LS_ISA_NS {
namespace {

// Register budget: 2·kMr accumulators + 2 B vectors + 1 broadcast of A must fit the register file
// (16 ymm for AVX2: 6 rows; 32 zmm for AVX-512: 12 rows).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kMr = 12;
using VecF = __m512;
using VecD = __m512d;
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vload(const float* p) { return _mm512_load_ps(p); }
inline void vstore(float* p, VecF v) { _mm512_store_ps(p, v); }
inline VecF vset1(float x) { return _mm512_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
// The zero-masked forms: GCC 12 warns (-Wmaybe-uninitialized) on the unmasked ones, whose
// pass-through operand is _mm512_undefined_*; all lanes are selected, so the result is the same.
template <int kHalfIndex>
inline VecD widen(VecF v) {
  return _mm512_maskz_cvtps_pd(
      0xff, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xf, _mm512_castps_pd(v), kHalfIndex)));
}
inline VecD widen_lo(VecF v) { return widen<0>(v); }
inline VecD widen_hi(VecF v) { return widen<1>(v); }
inline VecD dzero() { return _mm512_setzero_pd(); }
inline VecD dload(const double* p) { return _mm512_load_pd(p); }
inline void dstore(double* p, VecD v) { _mm512_store_pd(p, v); }
inline VecD dadd(VecD a, VecD b) { return _mm512_add_pd(a, b); }
inline VecD dsub(VecD a, VecD b) { return _mm512_sub_pd(a, b); }
inline VecD dor(VecD a, VecD b) { return _mm512_or_pd(a, b); }
inline bool dany(VecD a) { return _mm512_test_epi64_mask(_mm512_castpd_si512(a), _mm512_castpd_si512(a)) != 0; }
// kHalf floats: a vector of doubles rounded to fp32 (MXCSR's round-to-nearest-even, as
// static_cast<float>; the zero-masked form for the reason given at widen()).
using HalfF = __m256;
inline HalfF narrow(VecD d) { return _mm512_maskz_cvtpd_ps(0xff, d); }
inline HalfF hloadu(const float* p) { return _mm256_loadu_ps(p); }
inline void hstoreu(float* p, HalfF v) { _mm256_storeu_ps(p, v); }
inline HalfF hadd(HalfF a, HalfF b) { return _mm256_add_ps(a, b); }
#else
constexpr int kLanes = 8;
constexpr int kMr = 6;
using VecF = __m256;
using VecD = __m256d;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vload(const float* p) { return _mm256_load_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_store_ps(p, v); }
inline VecF vset1(float x) { return _mm256_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecD widen_lo(VecF v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
inline VecD widen_hi(VecF v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
inline VecD dzero() { return _mm256_setzero_pd(); }
inline VecD dload(const double* p) { return _mm256_load_pd(p); }
inline void dstore(double* p, VecD v) { _mm256_store_pd(p, v); }
inline VecD dadd(VecD a, VecD b) { return _mm256_add_pd(a, b); }
inline VecD dsub(VecD a, VecD b) { return _mm256_sub_pd(a, b); }
inline VecD dor(VecD a, VecD b) { return _mm256_or_pd(a, b); }
inline bool dany(VecD a) { return !_mm256_testz_si256(_mm256_castpd_si256(a), _mm256_castpd_si256(a)); }
using HalfF = __m128;
inline HalfF narrow(VecD d) { return _mm256_cvtpd_ps(d); }
inline HalfF hloadu(const float* p) { return _mm_loadu_ps(p); }
inline void hstoreu(float* p, HalfF v) { _mm_storeu_ps(p, v); }
inline HalfF hadd(HalfF a, HalfF b) { return _mm_add_ps(a, b); }
#endif
constexpr int kNr = 2 * kLanes;
constexpr int kHalf = kLanes / 2;  // doubles per vector
constexpr int64_t kAlign = 64;     // bytes; every packed panel starts on a cache line

// What a tile does with its results.
enum class Output {
  kRound,     // canonical dot rounded once, then the epilogue (matmul_canonical)
  kPartials,  // the fp32 chain of the only chunk (K <= 64), stored as is
  kExact,     // the exact sum of chunk partials added to an ExactAccumulator
};

// Per-tile double sums and "inexact or non-finite" flags, laid out like the tile (kMr x kNr).
struct alignas(kAlign) TileSums {
  double sum[kMr * kNr];
  double flag[kMr * kNr];  // nonzero bits: recompute this element with the scalar specification
};

// s += p for kLanes elements, accumulating the exactness test into flag (header comment).
// kFirst: the first chunk, where s and flag are taken as +0.0 and 0 rather than read, so that a
// tile's sums need no zeroing pass (the same operations as adding to stored zeros: +0.0 + p is
// computed, turning a -0 partial into +0 as ChunkCombiner's double does).
template <bool kFirst>
inline void combine_exact(VecF partial, double* s, double* flag) {
  const VecD p[2] = {widen_lo(partial), widen_hi(partial)};
  for (int h = 0; h < 2; ++h) {
    const VecD sd = kFirst ? dzero() : dload(s + h * kHalf);
    const VecD t = dadd(sd, p[h]);
    const VecD x = dsub(dsub(t, sd), p[h]);
    const VecD y = dsub(dsub(t, p[h]), sd);
    const VecD inexact = dor(x, y);
    dstore(flag + h * kHalf, kFirst ? inexact : dor(dload(flag + h * kHalf), inexact));
    dstore(s + h * kHalf, t);
  }
}

// One kMr x kNr tile over the whole K: a (K, kMr) A micro-panel times a (K, kNr) B panel.
// kPartials: stores the single chunk's chains into `partials`; otherwise combines every chunk
// into `sums`, which the first chunk initialises (K >= 1).
template <bool kPartials>
void tile_chunks(int64_t K, const float* ap, const float* bp, TileSums* sums, float* partials) {
  for (int64_t k0 = 0; k0 < K; k0 += kCanonicalChunk) {
    const int64_t len = std::min<int64_t>(kCanonicalChunk, K - k0);
    VecF c0[kMr], c1[kMr];
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) c0[r] = c1[r] = vzero();
    const float* a = ap + k0 * kMr;
    const float* b = bp + k0 * kNr;
    for (int64_t k = 0; k < len; ++k) {
      const VecF b0 = vload(b);
      const VecF b1 = vload(b + kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < kMr; ++r) {
        const VecF av = vset1(a[r]);
        c0[r] = vfma(av, b0, c0[r]);  // = fmaf(a[r][k], b[k][j], acc): operands commute exactly
        c1[r] = vfma(av, b1, c1[r]);
      }
      a += kMr;
      b += kNr;
    }
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      if constexpr (kPartials) {
        vstore(partials + r * kNr, c0[r]);
        vstore(partials + r * kNr + kLanes, c1[r]);
      } else if (k0 == 0) {
        combine_exact<true>(c0[r], sums->sum + r * kNr, sums->flag + r * kNr);
        combine_exact<true>(c1[r], sums->sum + r * kNr + kLanes, sums->flag + r * kNr + kLanes);
      } else {
        combine_exact<false>(c0[r], sums->sum + r * kNr, sums->flag + r * kNr);
        combine_exact<false>(c1[r], sums->sum + r * kNr + kLanes, sums->flag + r * kNr + kLanes);
      }
    }
  }
}

// One full row of a tile (kNr columns) for Output::kRound: the exact double sums rounded to fp32
// once, then + bias and the accumulation, kHalf columns at a time — the scalar epilogue's
// operations element by element. Returns false, writing nothing, when an element of the row is
// flagged (inexact or non-finite sum): the caller then takes the scalar path for the row.
bool store_row_rounded(const double* sum, const double* flag, float* c, const float* bias,
                       bool accumulate) {
  constexpr int kParts = kNr / kHalf;
  VecD any = dload(flag);
  for (int h = 1; h < kParts; ++h) any = dor(any, dload(flag + h * kHalf));
  if (dany(any)) return false;
  for (int h = 0; h < kParts; ++h) {
    HalfF x = narrow(dload(sum + h * kHalf));
    if (bias != nullptr) x = hadd(x, hloadu(bias + h * kHalf));
    if (accumulate) x = hadd(hloadu(c + h * kHalf), x);
    hstoreu(c + h * kHalf, x);
  }
  return true;
}

bool flagged(double f) {
  uint64_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits != 0;
}

// Packing scratch of the calling thread, grown on demand and reused across calls (no allocation
// in the steady state). Callers inside their own parallel region each get their own buffers.
float* scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  const auto need = static_cast<size_t>(floats + kAlign / sizeof(float));
  if (buf.size() < need) buf.resize(need);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  addr = (addr + kAlign - 1) & ~static_cast<uintptr_t>(kAlign - 1);
  return reinterpret_cast<float*>(addr);
}

// A (M, K) -> ceil(M/kMr) micro-panels of (K, kMr), zero rows past M. The loop order follows the
// smaller stride so that reads are sequential for both A and Aᵀ.
void pack_a(int64_t M, int64_t K, const float* A, int64_t sam, int64_t sak, float* out,
            int64_t panels) {
  const bool rows_contiguous = std::abs(sak) <= std::abs(sam);
#pragma omp parallel for schedule(static) if (M * K > (int64_t{1} << 15))
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = out + p * K * kMr;
    const int rows = static_cast<int>(std::min<int64_t>(kMr, M - p * kMr));
    if (rows_contiguous) {
      for (int r = 0; r < kMr; ++r) {
        if (r < rows) {
          const float* src = A + (p * kMr + r) * sam;
          for (int64_t k = 0; k < K; ++k) dst[k * kMr + r] = src[k * sak];
        } else {
          for (int64_t k = 0; k < K; ++k) dst[k * kMr + r] = 0.0f;
        }
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float* src = A + p * kMr * sam + k * sak;
        for (int r = 0; r < kMr; ++r) dst[k * kMr + r] = r < rows ? src[r * sam] : 0.0f;
      }
    }
  }
}

// B (K, N) -> ceil(N/kNr) panels of (K, kNr), zero columns past N; loop order as in pack_a.
void pack_b(int64_t N, int64_t K, const float* B, int64_t sbk, int64_t sbn, float* out,
            int64_t panels) {
  const bool rows_contiguous = std::abs(sbn) <= std::abs(sbk);
#pragma omp parallel for schedule(static) if (N * K > (int64_t{1} << 15))
  for (int64_t q = 0; q < panels; ++q) {
    float* dst = out + q * K * kNr;
    const int cols = static_cast<int>(std::min<int64_t>(kNr, N - q * kNr));
    if (rows_contiguous) {
      for (int64_t k = 0; k < K; ++k) {
        const float* src = B + k * sbk + q * kNr * sbn;
        for (int j = 0; j < kNr; ++j) dst[k * kNr + j] = j < cols ? src[j * sbn] : 0.0f;
      }
    } else {
      for (int j = 0; j < kNr; ++j) {
        if (j < cols) {
          const float* src = B + (q * kNr + j) * sbn;
          for (int64_t k = 0; k < K; ++k) dst[k * kNr + j] = src[k * sbk];
        } else {
          for (int64_t k = 0; k < K; ++k) dst[k * kNr + j] = 0.0f;
        }
      }
    }
  }
}

// Where a tile's results go (one of the three Output modes).
struct Sink {
  float* C = nullptr;
  int64_t ldc = 0;
  MatmulEpilogue epilogue;
  ExactAccumulator* acc = nullptr;
  int64_t offset = 0;
};

template <Output kOut>
void matmul_packed(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak,
                   const float* B, int64_t sbk, int64_t sbn, const Sink& sink) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0, "M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  const int64_t a_panels = (M + kMr - 1) / kMr;
  const int64_t b_panels = (N + kNr - 1) / kNr;
  // B panels are read with aligned loads: start them on a cache line after A's panels.
  constexpr int64_t kLineFloats = kAlign / static_cast<int64_t>(sizeof(float));
  const int64_t a_size = (a_panels * kMr * K + kLineFloats - 1) / kLineFloats * kLineFloats;
  float* apack = scratch(a_size + b_panels * kNr * K);
  float* bpack = apack + a_size;
  pack_a(M, K, A, sam, sak, apack, a_panels);
  pack_b(N, K, B, sbk, sbn, bpack, b_panels);

  const int64_t tiles = a_panels * b_panels;
  // Tile t covers B panel t / a_panels and A micro-panel t % a_panels: a thread's contiguous range
  // of tiles walks down one B panel, which stays in L2 while A streams past it.
#pragma omp parallel for schedule(static) if (M * N * K > (int64_t{1} << 18))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t ip = t % a_panels;
    const int64_t jp = t / a_panels;
    const int rows = static_cast<int>(std::min<int64_t>(kMr, M - ip * kMr));
    const int cols = static_cast<int>(std::min<int64_t>(kNr, N - jp * kNr));
    const float* ap = apack + ip * kMr * K;
    const float* bp = bpack + jp * kNr * K;
    if constexpr (kOut == Output::kPartials) {
      alignas(kAlign) float part[kMr * kNr];
      if (K == 0) std::fill(part, part + kMr * kNr, 0.0f);
      tile_chunks<true>(K, ap, bp, nullptr, part);
      for (int r = 0; r < rows; ++r) {
        float* c = sink.C + (ip * kMr + r) * sink.ldc + jp * kNr;
        for (int j = 0; j < cols; ++j) c[j] = part[r * kNr + j];
      }
    } else {
      TileSums sums;
      if (K == 0) {
        std::fill(sums.sum, sums.sum + kMr * kNr, 0.0);
        std::fill(sums.flag, sums.flag + kMr * kNr, 0.0);
      }
      tile_chunks<false>(K, ap, bp, &sums, nullptr);
      for (int r = 0; r < rows; ++r) {
        const int64_t m = ip * kMr + r;
        if constexpr (kOut == Output::kRound) {
          const float* bias = sink.epilogue.col_bias ? sink.epilogue.col_bias + jp * kNr : nullptr;
          if (cols == kNr && store_row_rounded(sums.sum + r * kNr, sums.flag + r * kNr,
                                               sink.C + m * sink.ldc + jp * kNr, bias,
                                               sink.epilogue.accumulate)) {
            continue;
          }
        }
        for (int j = 0; j < cols; ++j) {
          const int64_t n = jp * kNr + j;
          const bool slow = flagged(sums.flag[r * kNr + j]);
          if constexpr (kOut == Output::kRound) {
            float v = slow ? canonical_dot(A + m * sam, sak, B + n * sbn, sbk, K)
                           : static_cast<float>(sums.sum[r * kNr + j]);
            if (sink.epilogue.col_bias != nullptr) v = v + sink.epilogue.col_bias[n];
            float& c = sink.C[m * sink.ldc + n];
            c = sink.epilogue.accumulate ? c + v : v;
          } else {
            const auto idx = static_cast<size_t>(sink.offset + m * N + n);
            if (!slow) {
              // The double is the exact sum of this call's chunk partials: adding it at once
              // leaves the accumulator's exact total, hence its one rounding, unchanged.
              sink.acc->add(idx, sums.sum[r * kNr + j]);
            } else {
              for (int64_t k0 = 0; k0 < K; k0 += kCanonicalChunk) {
                const int64_t len = std::min<int64_t>(kCanonicalChunk, K - k0);
                sink.acc->add(idx, chunk_dot(A + m * sam + k0 * sak, sak,
                                             B + n * sbn + k0 * sbk, sbk, len));
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

void matmul_canonical_packed(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,
                             const float* A, int64_t sam, int64_t sak, const float* B,
                             int64_t sbk, int64_t sbn, MatmulEpilogue epilogue) {
  Sink sink;
  sink.C = C;
  sink.ldc = ldc;
  sink.epilogue = epilogue;
  matmul_packed<Output::kRound>(M, N, K, A, sam, sak, B, sbk, sbn, sink);
}

void matmul_chunk_partials_packed(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,
                                  const float* A, int64_t sam, int64_t sak, const float* B,
                                  int64_t sbk, int64_t sbn) {
  LS_CHECK(K <= kCanonicalChunk, "chunk partials need K <= ", kCanonicalChunk, ", got K=", K);
  Sink sink;
  sink.C = C;
  sink.ldc = ldc;
  matmul_packed<Output::kPartials>(M, N, K, A, sam, sak, B, sbk, sbn, sink);
}

void matmul_chunks_exact_packed(int64_t M, int64_t N, int64_t K, ExactAccumulator& acc,
                                int64_t offset, const float* A, int64_t sam, int64_t sak,
                                const float* B, int64_t sbk, int64_t sbn) {
  Sink sink;
  sink.acc = &acc;
  sink.offset = offset;
  matmul_packed<Output::kExact>(M, N, K, A, sam, sak, B, sbk, sbn, sink);
}

}  // namespace lockstep::cpu::LS_ISA_NS
