// The canonical matrix product as a packed, register-blocked SIMD kernel; compiled once per ISA
// (kernels/CMakeLists.txt) into lockstep::cpu::avx2 and lockstep::cpu::avx512, and once more with
// LS_BF16_PAIRS into lockstep::cpu::avx512bf16 for operands that hold bf16 values: there the
// panels hold bf16 pair words and the FMA loop is VDPBF16PS's (see chunk_dots), the rest the same.
//
// Algorithm (matmul_packed_mrx2v):
//  - B is packed into panels of kNr = 2 vectors of columns, k-major (panel[k][j]); A into
//    micro-panels of kMr rows, k-major (panel[k][r]), or row by row where A's rows are contiguous
//    and few B panels share a micro-panel; edges are padded with zeros and the padded results
//    discarded. Packing absorbs any strides, so A or B may be transposed views.
//  - A kMr x kNr output tile keeps 2·kMr vector accumulators. Each SIMD lane is one output
//    element's sequential fp32 FMA chain over a chunk of 64 k's, started from +0.0f: exactly
//    chunk_dot of kernels/ops/canonical.hpp, so the bits do not depend on the vector width.
//  - The lane partials p_j are widened to double and added, in chunk order, to per-element double
//    sums t_j = t_{j-1} + p_j (t_0 = +0.0) — ChunkCombiner's additions, in its order — a group of
//    up to kGroup chunks at a time (their partials wait in a buffer, so the sums are loaded and
//    stored once a group). On AVX-512 a group is combined while the next group's FMA loop runs, a
//    step between each of its k's, the tile's results going out one tile late. Beside the sums
//    each element keeps big = max_j |t_j| and small = min |p_j| over its nonzero partials.
//    Exactness argument (checked once per element, after the last chunk):
//      every finite fp32 value with biased exponent field e is an integer multiple of
//      g(e) = 2^(max(e,1) − 150), and |p| >= small implies field(p) >= field(small); so every
//      partial (zeros included) and every exact prefix sum S_j is a multiple of
//      g = g(field(small)). A multiple of g below 2^53·g in magnitude is a double, so
//      t_j = RN(t_{j−1} + p_j) equals S_j whenever t_{j−1} = S_{j−1} and |S_j| < 2^53·g; and if
//      |S_j| >= 2^53·g then |t_j| >= 2^53·g (rounding is monotone and 2^53·g is a double). By
//      induction: if big < 2^53·g, every t_j is exact — which big's exponent field eb shows when
//      2^(eb − 1022) <= 2^(53 + max(field(small),1) − 150), i.e. eb − max(field(small),1) <= 925.
//      A non-finite partial makes every later t_j inf or NaN, and finite partials cannot
//      overflow a double, so "the last t is finite" means "every partial was finite".
//    Such an element's scalar specification performs the same exact double additions in the same
//    order (TwoSum finds no error) and rounds t_c to fp32 once: the vector path narrows t_c.
//    Every other element — inexact, non-finite, or beyond what this sufficient test proves — is
//    recomputed with the scalar specification canonical_dot itself.
//    With a single chunk (K <= 64) there is nothing to combine: the result is RN(+0.0 + p), which
//    for finite p is the fp32 addition p + 0.0f; non-finite partials take the scalar path.
//  - Threads split the output into tiles, each thread a contiguous range of them, and share the
//    packing (run_product); no sum crosses threads, so the bits do not depend on the thread count
//    either.
//  - Output::kFast, fast mode's GEMM where OpenBLAS's kernel is narrower than the CPU: the same
//    packing, tiles and threads, each element one fp32 chain over a K block, no chunks.
// Not here: dispatch (matmul.cpp), the choice of fast mode's GEMM and OpenBLAS's
// (sgemm_threads.cpp), the linear layer (linear.cpp).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/bf16_bits.hpp"
#include "kernels/cpu/matmul_isa.hpp"
#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"

#ifndef LS_ISA_NS
#error "matmul.isa.cpp is compiled once per ISA with -DLS_ISA_NS=avx2 or -DLS_ISA_NS=avx512"
#endif

namespace lockstep::cpu::LS_ISA_NS {
namespace {

// The exactness test of the header comment: a double sum is proven exact when the exponent field
// of max |t_j| exceeds max(field(min nonzero |p_j|), 1) by at most this much.
constexpr int64_t kExactWindow = 925;

// K block of a long product (a multiple of the chunk): 2048 k's. A tile's sums (TileSums, 20
// bytes an element of the whole output) are stored after each block and read before the next, so
// shorter blocks multiply that traffic: with 512 the head's input gradient (K = 8192, N = 512 on
// bench_medium's shapes) spent more time moving its 10 MiB of sums than on the panels' cache misses
// that a longer block brings (measured on Zen 5: canonical 45 -> 35 ms bf16, fast fp32 54 -> 49 ms).
constexpr int64_t kKBlock = 32 * kCanonicalChunk;

// Register budget: 2·kMr accumulators + 2 B vectors + 1 broadcast of A must fit the register file
// (16 ymm for AVX2: 6 rows). AVX-512's 32 zmm would take 12 rows; 10 leave the combination of the
// previous group of chunks (kInterleave) the 7 it needs beside the FMA loop.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kMr = 10;
using VecF = __m512;
using VecD = __m512d;
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vload(const float* p) { return _mm512_load_ps(p); }
inline VecF vloadu(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm512_store_ps(p, v); }
inline void vstoreu(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF vset1(float x) { return _mm512_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
// True when no lane is inf or NaN (exponent field below all ones).
inline bool vall_finite(VecF v) {
  const __m512i e = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
  return _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0x7f800000)) == 0;
}
// kHalf floats at p widened to double (the zero-masked form: GCC 12 warns -Wmaybe-uninitialized
// on the unmasked one, whose pass-through operand is _mm512_undefined_pd; all lanes are selected,
// so the result is the same).
inline VecD dwiden(const float* p) { return _mm512_maskz_cvtps_pd(0xff, _mm256_load_ps(p)); }
inline VecD dzero() { return _mm512_setzero_pd(); }
inline VecD dload(const double* p) { return _mm512_load_pd(p); }
inline void dstore(double* p, VecD v) { _mm512_store_pd(p, v); }
inline VecD dadd(VecD a, VecD b) { return _mm512_add_pd(a, b); }
inline VecD dsub(VecD a, VecD b) { return _mm512_sub_pd(a, b); }
inline VecD dloadu(const double* p) { return _mm512_loadu_pd(p); }
inline void dstoreu(double* p, VecD v) { _mm512_storeu_pd(p, v); }
// True when every lane of v is +0.0 or -0.0 (a NaN lane is not).
inline bool dall_zero(VecD v) { return _mm512_cmp_pd_mask(v, dzero(), _CMP_NEQ_UQ) == 0; }
// max(big, |t|) (VRANGEPD: absolute maximum, sign cleared; a NaN t leaves big as it is, which the
// finiteness test of the sum makes irrelevant).
inline VecD dabsmax(VecD big, VecD t) { return _mm512_range_pd(big, t, 0x0B); }
// min(small, |p|) over nonzero p: VRANGEPS's absolute minimum in the lanes whose bits other than
// the sign are not all zero; a ±0 lane keeps small. (Not VFIXUPIMMPS mapping ±0 to +inf: on Zen 5
// it issues on the FMA pipes.)
inline VecF vinf() { return _mm512_set1_ps(__builtin_huge_valf()); }
inline VecF vround_bf16(VecF x) { return bf16_nearest16(x); }
inline VecF vabsmin_nonzero(VecF small, VecF p) {
  const __mmask16 nonzero =
      _mm512_test_epi32_mask(_mm512_castps_si512(p), _mm512_set1_epi32(0x7fffffff));
  return _mm512_mask_range_ps(small, nonzero, small, p, 0x0A);
}
// Bit i set when element i (of kLanes) passes the exactness test of the header comment:
// eb − max(field(small), 1) <= 925 and the sum is finite. t0, big0: elements [0, kHalf); t1,
// big1: the rest. All kLanes at once: big's exponent fields gathered into 32-bit lanes beside
// small's.
inline uint32_t exact_bits(VecD t0, VecD t1, VecD big0, VecD big1, VecF small) {
  // Zero-masked shifts and maximum for the reason given at dwiden().
  const __m512i eb0 = _mm512_maskz_srli_epi64(0xff, _mm512_castpd_si512(big0), 52);
  const __m512i eb1 = _mm512_maskz_srli_epi64(0xff, _mm512_castpd_si512(big1), 52);
  const __m512i low_dwords =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i eb = _mm512_permutex2var_epi32(eb0, low_dwords, eb1);
  const __m512i fs = _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(small), 23);
  const __m512i es = _mm512_maskz_max_epu32(0xffff, fs, _mm512_set1_epi32(1));
  const __mmask16 window =
      _mm512_cmple_epi32_mask(_mm512_sub_epi32(eb, es), _mm512_set1_epi32(kExactWindow));
  // VFPCLASSPD: QNaN (0x01), +inf (0x08), −inf (0x10), SNaN (0x80).
  constexpr int kNonFinite = 0x99;
  const __mmask16 nonfinite = _mm512_kunpackb(_mm512_fpclass_pd_mask(t1, kNonFinite),
                                               _mm512_fpclass_pd_mask(t0, kNonFinite));
  return static_cast<uint32_t>(window & ~nonfinite);
}
// Two vectors of doubles rounded to fp32 (MXCSR's round-to-nearest-even, as static_cast<float>)
// into one vector, lo's in the low lanes (the zero-masked form for the reason given at dwiden()).
inline VecF narrow(VecD lo, VecD hi) {
  const __m512 low = _mm512_insertf32x8(_mm512_setzero_ps(), _mm512_maskz_cvtpd_ps(0xff, lo), 0);
  return _mm512_insertf32x8(low, _mm512_maskz_cvtpd_ps(0xff, hi), 1);
}
// Stores the first n lanes of v.
inline void vstore_first(float* p, VecF v, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
}
// r[i][j] <- r[j][i] for a 16 x 16 block (zero-masked unpacks for the reason given at dwiden()).
inline void transpose(VecF r[kLanes]) {
  VecF t[kLanes];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(0xffff, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xffff, r[2 * i], r[2 * i + 1]);
  }
  const auto pd = [](VecF v) { return _mm512_castps_pd(v); };
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, pd(t[4 * i + 1]), pd(t[4 * i + 3])));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_maskz_shuffle_f32x4(0xffff, r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_maskz_shuffle_f32x4(0xffff, r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_maskz_shuffle_f32x4(0xffff, r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_maskz_shuffle_f32x4(0xffff, r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0xdd);
  }
}
#else
constexpr int kLanes = 8;
constexpr int kMr = 6;
using VecF = __m256;
using VecD = __m256d;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vload(const float* p) { return _mm256_load_ps(p); }
inline VecF vloadu(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_store_ps(p, v); }
inline void vstoreu(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vset1(float x) { return _mm256_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline bool vall_finite(VecF v) {
  const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000));
  return _mm256_testz_si256(_mm256_cmpeq_epi32(e, _mm256_set1_epi32(0x7f800000)),
                            _mm256_set1_epi32(-1)) != 0;
}
inline VecD dwiden(const float* p) { return _mm256_cvtps_pd(_mm_load_ps(p)); }
inline VecD dzero() { return _mm256_setzero_pd(); }
inline VecD dload(const double* p) { return _mm256_load_pd(p); }
inline void dstore(double* p, VecD v) { _mm256_store_pd(p, v); }
inline VecD dadd(VecD a, VecD b) { return _mm256_add_pd(a, b); }
inline VecD dsub(VecD a, VecD b) { return _mm256_sub_pd(a, b); }
inline VecD dloadu(const double* p) { return _mm256_loadu_pd(p); }
inline void dstoreu(double* p, VecD v) { _mm256_storeu_pd(p, v); }
inline bool dall_zero(VecD v) {
  return _mm256_movemask_pd(_mm256_cmp_pd(v, dzero(), _CMP_NEQ_UQ)) == 0;
}
// max(big, |t|); for NaN lanes whatever MAXPD returns (the sum's finiteness test covers them).
inline VecD dabsmax(VecD big, VecD t) {
  return _mm256_max_pd(big, _mm256_andnot_pd(_mm256_set1_pd(-0.0), t));
}
// min(small, |p|) over nonzero p: ±0 becomes +inf before the minimum.
inline VecF vinf() { return _mm256_set1_ps(__builtin_huge_valf()); }
inline VecF vround_bf16(VecF x) { return bf16_nearest8(x); }
inline VecF vabsmin_nonzero(VecF small, VecF p) {
  const VecF a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), p);
  const VecF q = _mm256_blendv_ps(a, vinf(), _mm256_cmp_ps(a, vzero(), _CMP_EQ_OQ));
  return _mm256_min_ps(small, q);
}
inline uint32_t exact_half(VecD sum, VecD big, __m128 small) {
  const __m256i eb = _mm256_srli_epi64(_mm256_castpd_si256(big), 52);
  const __m128i es32 =
      _mm_max_epu32(_mm_srli_epi32(_mm_castps_si128(small), 23), _mm_set1_epi32(1));
  const __m256i es = _mm256_cvtepu32_epi64(es32);
  const __m256i wide = _mm256_cmpgt_epi64(_mm256_sub_epi64(eb, es), _mm256_set1_epi64x(kExactWindow));
  const __m256i exp = _mm256_set1_epi64x(0x7ff0000000000000LL);
  const __m256i nonfinite = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_castpd_si256(sum), exp), exp);
  const int bad = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_or_si256(wide, nonfinite)));
  return static_cast<uint32_t>(~bad & 0xf);
}
inline uint32_t exact_bits(VecD t0, VecD t1, VecD big0, VecD big1, VecF small) {
  return exact_half(t0, big0, _mm256_castps256_ps128(small)) |
         exact_half(t1, big1, _mm256_extractf128_ps(small, 1)) << kLanes / 2;
}
inline VecF narrow(VecD lo, VecD hi) {
  return _mm256_insertf128_ps(_mm256_zextps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1);
}
inline void vstore_first(float* p, VecF v, int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), v);
}
// r[i][j] <- r[j][i] for an 8 x 8 block.
inline void transpose(VecF r[kLanes]) {
  VecF t[kLanes], u[kLanes];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif
constexpr int kNr = 2 * kLanes;
constexpr int kHalf = kLanes / 2;  // doubles per vector
constexpr int64_t kAlign = 64;     // bytes; every packed panel starts on a cache line
// Whether this build packs its operands as bf16 pair words (the avx512bf16 build, matmul_isa.hpp).
#if defined(LS_BF16_PAIRS)
constexpr bool kPairs = true;
#else
constexpr bool kPairs = false;
#endif

// What a tile does with its results.
enum class Output {
  kRound,     // canonical dot rounded once, then the epilogue (matmul_canonical)
  kPartials,  // the fp32 chain of the only chunk (K <= 64), stored as is
  kExact,     // the exact sum of chunk partials added to an ExactAccumulator
  kFast,      // alpha·(one fp32 FMA chain over each K block) + beta·C: fast mode's sgemm
};

// Per-tile state of the chunk combination (header comment), laid out like the tile (kMr x kNr).
struct alignas(kAlign) TileSums {
  double sum[kMr * kNr];   // t_j: the double sum of the partials so far
  double big[kMr * kNr];   // max |t_j| so far
  float small[kMr * kNr];  // min |p_j| over the nonzero partials so far (+inf: none yet)
};

// Chunks combined in one pass: a tile stores each chunk's fp32 chains into a group buffer of up
// to kGroup chunks, and the group is added into the tile's sums chunk by chunk in order, each
// element's state loaded and stored once a group. Storing the sums (20 bytes an element) after
// every chunk cost the FMA loop about a fifth of its time on Zen 5, where 512-bit stores take
// issue slots from the FMAs. Eight chunks: the two group buffers (20 KiB on AVX-512) stay in L1;
// a K block (kKBlock) is four groups, between which the tile's sums stay in L1 too.
constexpr int kGroup = 8;
constexpr int kVecs = kMr * kNr / kLanes;  // vectors of a tile
static_assert(kVecs <= 32, "a tile's vectors fit a uint32_t mask");

// Whether a group is combined between the k's of the next group's FMA loop. AVX-512 leaves the
// combination state registers beside the 2·kMr accumulators; AVX2 has none to spare, and combines
// a group after the next one's FMA loop.
constexpr bool kInterleave = kLanes == 16;

// One vector (kLanes elements from index i) of a tile's combination state, in registers.
struct LaneSums {
  VecD t[2], big[2];
  VecF small;
};

void store_lanes(const LaneSums& v, TileSums& s, int i) {
  for (int h = 0; h < 2; ++h) {
    dstore(s.sum + i + h * kHalf, v.t[h]);
    dstore(s.big + i + h * kHalf, v.big[h]);
  }
  vstore(s.small + i, v.small);
}

// Exactness bits of kLanes elements (bit j: element j's double sum is proven exact and finite).
uint32_t lanes_exact_bits(const LaneSums& v) {
  return exact_bits(v.t[0], v.t[1], v.big[0], v.big[1], v.small);
}

// kLanes double sums (p[0]: the first kHalf) rounded to fp32 once, then + bias, then rounded to
// bf16 where `round` — the scalar epilogue's operations (store_element_spec) element by element.
[[gnu::always_inline]] inline void store_rounded(const VecD p[2], float* c, const float* bias, bool round) {
  VecF x = narrow(p[0], p[1]);
  if (bias != nullptr) x = vadd(x, vloadu(bias));
  vstoreu(c, round ? vround_bf16(x) : x);
}

// The TwoSum error of s + p (t = s + p) in every lane: add_exact's test.
inline VecD two_sum_errors(VecD s, VecD p, VecD t) {
  const VecD bp = dsub(t, s);
  const VecD ap = dsub(t, bp);
  return dadd(dsub(s, ap), dsub(p, bp));
}

// kLanes exact double sums p (p[0]: the first kHalf) added to elements [idx, idx + kLanes) of the
// accumulator the way ExactAccumulator::add's fast path adds them — s + p kept where no element
// has spilled and TwoSum's error is zero in every lane (add_exact's operations, lane by lane).
// False, with nothing added, when that does not hold: add() then takes the elements one by one.
// (Adding a call's exact sum at once leaves the accumulator's exact total, hence its one
// rounding, as adding its chunk partials one by one would.)
inline bool add_exact_lanes(ExactAccumulator& acc, size_t idx, const VecD p[2]) {
  uint64_t flags[kLanes / 8];
  std::memcpy(flags, acc.spill_flags() + idx, sizeof(flags));
  uint64_t any_spilled = 0;
  for (uint64_t f : flags) any_spilled |= f;
  if (any_spilled != 0) return false;
  double* s = acc.partial_sums_to_add() + idx;
  const VecD s0 = dloadu(s), s1 = dloadu(s + kHalf);
  const VecD t0 = dadd(s0, p[0]), t1 = dadd(s1, p[1]);
  if (!dall_zero(two_sum_errors(s0, p[0], t0)) || !dall_zero(two_sum_errors(s1, p[1], t1))) return false;
  dstoreu(s, t0);
  dstoreu(s + kHalf, t1);
  return true;
}

// Where a tile's results go on the vector path, from the tile's first element: for
// Output::kRound its corner of C and the epilogue's bias columns; for Output::kExact (acc set)
// its elements of the accumulator, rows ld_acc apart. rows x cols: the part inside the product.
struct TileOut {
  int rows = 0, cols = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
  bool round_bf16 = false;
  ExactAccumulator* acc = nullptr;
  size_t index = 0;
  int64_t ld_acc = 0;
};

// A tile's group of chunk partials waiting to be added into its sums (chunks == 0: none). `fresh`:
// the tile's first group, whose state starts as t = +0.0, big = +0.0, small = +inf rather than
// being read, so that a tile needs no zeroing pass (the same operations as on stored initial
// values: +0.0 + p is computed, turning a −0 partial into +0 as ChunkCombiner's double does).
// `finish`: the tile's last group, after which each vector whose sums are all proven exact goes
// to `out` at once — rounded into C, or added into the accumulator — without its sums being
// stored; any other vector inside the tile's rows x cols (an element inexact, non-finite, or a
// vector reaching past N) has its state stored and is left to the element path of tile `tile`.
struct PendingGroup {
  int chunks = 0;
  bool fresh = false;
  bool finish = false;
  TileSums* sums = nullptr;
  TileOut out;
  int64_t tile = 0;
};

// The vectors of a tile a group's combination goes through (bit v: elements [v·kLanes,
// v·kLanes + kLanes)): all of them, but for a tile's last group only those inside rows x cols.
uint32_t group_vectors(const PendingGroup& g) {
  if (g.chunks == 0) return 0;
  uint32_t vectors = 0;
  for (int v = 0; v < kVecs; ++v) {
    const int r = v * kLanes / kNr, j = v * kLanes % kNr;
    if (!g.finish || (r < g.out.rows && j < g.out.cols)) vectors |= uint32_t{1} << v;
  }
  return vectors;
}

// Fetches the output lines of vector v of a tile: its results are written long after the
// output was last touched, and usually miss the caches.
inline void prefetch_output(const TileOut& o, int v) {
  const int r = v * kLanes / kNr, j = v * kLanes % kNr;
  if (o.acc != nullptr) {
    const size_t idx = o.index + static_cast<size_t>(r * o.ld_acc + j);
    __builtin_prefetch(o.acc->partial_sums() + idx, 1);
    __builtin_prefetch(o.acc->partial_sums() + idx + kLanes - 1, 1);
    __builtin_prefetch(o.acc->spill_flags() + idx, 0);
  } else {
    __builtin_prefetch(o.c + r * o.ldc + j, 1);
    __builtin_prefetch(o.c + r * o.ldc + j + kLanes - 1, 1);
  }
}

// The combination of a pending group one step at a time — one chunk of one vector, kLanes
// elements — so that the FMA loop of the next group can take the steps between its k's: on Zen 5
// the conversions, double additions and VRANGEs then issue beside the FMAs almost for free, where
// run on their own they took a tenth of a canonical step. A local whose members the compiler keeps
// in registers (every member function is inlined).
class GroupCombiner {
 public:
  GroupCombiner(const PendingGroup& g, const float (*part)[kMr * kNr])
      : part_(part), g_(g), chunks_(g.chunks) {
    remaining_ = group_vectors(g_);
    if (g_.finish) {
      uint32_t ahead = remaining_;
      for (int n = 0; n < kPrefetchAhead && ahead != 0; ++n, ahead &= ahead - 1) {
        prefetch_output(g_.out, __builtin_ctz(ahead));
      }
    }
  }

  // What the combination left for the element path (bit v: elements [v·kLanes, v·kLanes + kLanes)).
  uint32_t left() const { return left_; }

  [[gnu::always_inline]] inline void step() {
    if (remaining_ == 0) return;
    const int i = __builtin_ctz(remaining_) * kLanes;
    if (chunk_ == 0) start_vector(i);
    add_chunk(i, chunk_);
    if (++chunk_ == chunks_) {
      end_vector(i);
      chunk_ = 0;
      remaining_ &= remaining_ - 1;
    }
  }

  // The steps left, one by one (beside an FMA loop, which has taken most of them).
  [[gnu::always_inline]] inline void finish_steps() {
    while (remaining_ != 0) step();
  }

  // The whole combination, vector after vector, on a combiner that has taken no step: the loop of
  // a combination on its own.
  [[gnu::always_inline]] inline void finish() {
    for (; remaining_ != 0; remaining_ &= remaining_ - 1) {
      const int i = __builtin_ctz(remaining_) * kLanes;
      start_vector(i);
      for (int c = 0; c < chunks_; ++c) add_chunk(i, c);
      end_vector(i);
    }
  }

 private:
  // Output lines are fetched this many vectors (of steps beside an FMA loop) ahead of their stores.
  static constexpr int kPrefetchAhead = 3;

  [[gnu::always_inline]] inline void start_vector(int i) {
    const TileSums& s = *g_.sums;
    v_.small = g_.fresh ? vinf() : vload(s.small + i);
    for (int h = 0; h < 2; ++h) {
      v_.t[h] = g_.fresh ? dzero() : dload(s.sum + i + h * kHalf);
      v_.big[h] = g_.fresh ? dzero() : dload(s.big + i + h * kHalf);
    }
    if (g_.finish) {
      uint32_t ahead = remaining_;
      for (int n = 0; n < kPrefetchAhead && ahead != 0; ++n) ahead &= ahead - 1;
      if (ahead != 0) prefetch_output(g_.out, __builtin_ctz(ahead));
    }
  }

  [[gnu::always_inline]] inline void add_chunk(int i, int c) {
    const float* p = part_[c] + i;
    for (int h = 0; h < 2; ++h) {
      v_.t[h] = dadd(v_.t[h], dwiden(p + h * kHalf));
      v_.big[h] = dabsmax(v_.big[h], v_.t[h]);
    }
    v_.small = vabsmin_nonzero(v_.small, vload(p));
  }

  [[gnu::always_inline]] inline void end_vector(int i) {
    constexpr uint32_t kAllLanes = (uint64_t{1} << kLanes) - 1;
    if (g_.finish) {
      const TileOut& o = g_.out;
      const int r = i / kNr, j = i % kNr;
      if (j + kLanes <= o.cols && lanes_exact_bits(v_) == kAllLanes) {
        if (o.acc == nullptr) {
          store_rounded(v_.t, o.c + r * o.ldc + j, o.bias != nullptr ? o.bias + j : nullptr, o.round_bf16);
          return;
        }
        if (add_exact_lanes(*o.acc, o.index + static_cast<size_t>(r * o.ld_acc + j), v_.t)) return;
      }
      left_ |= uint32_t{1} << (i / kLanes);
    }
    store_lanes(v_, *g_.sums, i);
  }

  const float (*part_)[kMr * kNr];
  PendingGroup g_;
  int chunks_;
  int chunk_ = 0;            // the next chunk of the vector in progress
  uint32_t remaining_ = 0;  // vectors not combined yet
  uint32_t left_ = 0;
  LaneSums v_{};  // the vector in progress (set when it starts)
};

// The combination of group g (its partials `part`) with no FMA loop beside it; returns what it
// left for the element path. Not inlined, so that its constants, hoisted into the caller, do not
// take registers from the FMA loop (AVX2 has exactly enough for the 6 x 2 tile).
[[gnu::noinline]] uint32_t combine_alone(const PendingGroup& g, const float (*part)[kMr * kNr]) {
  GroupCombiner comb(g, part);
  comb.finish();
  return comb.left();
}

// Per thread: two group buffers (one filling while the other's group is combined), the sums of
// tiles whose K is one block (the tile in flight and the one before, whose last group may still be
// pending), and the pending group (kInterleave only).
struct TilePipeline {
  alignas(kAlign) float group[2][kGroup][kMr * kNr];
  TileSums own[2];
  int filling = 0;
  PendingGroup pending;
};

TilePipeline& tile_pipeline() {
  thread_local std::unique_ptr<TilePipeline> pipeline = std::make_unique<TilePipeline>();
  return *pipeline;
}

// What the combination of a tile's last group left for the element path: the vectors (bit v:
// elements [v·kLanes, v·kLanes + kLanes)) of tile `tile`, their state in `sums`.
struct LeftVectors {
  uint32_t vectors = 0;
  int64_t tile = 0;
  const TileSums* sums = nullptr;
};

// The pending group's combination is over, leaving `vectors` to the element path: the group
// `next` (nothing when next.chunks == 0) takes its place, and what a finishing group left is
// returned.
LeftVectors retire_pending(TilePipeline& pl, uint32_t vectors, const PendingGroup& next) {
  LeftVectors left;
  if (pl.pending.chunks != 0 && pl.pending.finish) left = {vectors, pl.pending.tile, pl.pending.sums};
  pl.pending = next;
  pl.filling ^= 1;
  return left;
}

// A tile's accumulators: row r's two vectors in c0[r], c1[r].
[[gnu::always_inline]] inline void zero_tile(VecF c0[kMr], VecF c1[kMr]) {
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) c0[r] = c1[r] = vzero();
}
[[gnu::always_inline]] inline void store_tile(const VecF c0[kMr], const VecF c1[kMr], float* dst) {
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) {
    vstore(dst + r * kNr, c0[r]);
    vstore(dst + r * kNr + kLanes, c1[r]);
  }
}

// One chunk's FMA loop of a kMr x kNr tile (exactly chunk_dot in every lane: each accumulator
// starts from +0.0f), `between()` called after every k.
template <int kAStride, class Between>
[[gnu::always_inline]] inline void chunk_fmas(int64_t len, const float* a, const float* b, float* dst,
                                             Between&& between) {
  VecF c0[kMr], c1[kMr];
  zero_tile(c0, c1);
  const auto fma_k = [&] {
    const VecF b0 = vload(b);
    const VecF b1 = vload(b + kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const VecF av = vset1(a[kAStride == 0 ? r : r * kAStride]);
      c0[r] = vfma(av, b0, c0[r]);  // = fmaf(a[r][k], b[k][j], acc): operands commute exactly
      c1[r] = vfma(av, b1, c1[r]);
    }
    a += kAStride == 0 ? kMr : 1;
    b += kNr;
  };
  for (int64_t k = 0; k < len; ++k) {
    fma_k();
    between();
  }
  store_tile(c0, c1, dst);
}

#if defined(LS_BF16_PAIRS)
// Products of bf16 operands (LS_BF16_PAIRS, the avx512bf16 build): the packed panels hold pair
// words, the bf16 bits of k and k + 1 of one index in 32 bits, k's in the high half (pack_pairs).
// VDPBF16PS adds a lane's two products to its fp32 accumulator one after the other, the high
// halves' first (Intel SDM; checked on the CPU by tests/unit/kernels/test_matmul_bf16.cpp), each
// addition rounded to nearest even: a bf16 x bf16 product is exact in fp32, so that is the FMA
// chain of chunk_dot over k, k + 1 — except that the instruction reads subnormal inputs as zero
// and flushes subnormal results to zero. Canonical tiles use it only where neither can occur
// (dots_exact); the others run the same chains with FMAs (chunk_fmas_of_pairs).

// One chunk's VDPBF16PS loop of a kMr x kNr tile: `len` k's, (len + 1) / 2 pair words per index,
// `between()` after every pair. The A micro-panel is pair-major (kAStride 0: kMr words a pair) or
// row by row, kAStride words apart.
template <int kAStride, class Between>
[[gnu::always_inline]] inline void chunk_dots(int64_t len, const float* a, const float* b, float* dst,
                                             Between&& between) {
  VecF c0[kMr], c1[kMr];
  zero_tile(c0, c1);
  for (int64_t k = 0; k < len; k += 2) {
    const auto b0 = (__m512bh)_mm512_castps_si512(vload(b));
    const auto b1 = (__m512bh)_mm512_castps_si512(vload(b + kLanes));
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const float word = a[kAStride == 0 ? r : r * kAStride];
      const auto av = (__m512bh)_mm512_castps_si512(vset1(word));  // the pair word, bits unchanged
      c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
    }
    a += kAStride == 0 ? kMr : 1;
    b += kNr;
    between();
  }
  store_tile(c0, c1, dst);
}

// The same chains as chunk_dots with fp32 FMAs on the pair words' halves (subnormals kept): exactly
// chunk_dot, for the canonical tiles whose operands VDPBF16PS could flush.
template <int kAStride, class Between>
[[gnu::always_inline]] inline void chunk_fmas_of_pairs(int64_t len, const float* a, const float* b, float* dst,
                                                       Between&& between) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const auto first = [&](const float* p) {  // k's values of a vector of pair words
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(vload(p)), high));
  };
  const auto second = [&](const float* p) {  // k + 1's
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_castps_si512(vload(p)), 16));
  };
  VecF c0[kMr], c1[kMr];
  zero_tile(c0, c1);
  for (int64_t k = 0; k < len; k += 2) {
    const VecF b0 = first(b), b1 = first(b + kLanes), b0n = second(b), b1n = second(b + kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const uint32_t w = std::bit_cast<uint32_t>(a[kAStride == 0 ? r : r * kAStride]);
      const VecF ak = vset1(std::bit_cast<float>(w & 0xffff0000u));
      const VecF an = vset1(std::bit_cast<float>(w << 16));
      c0[r] = vfma(ak, b0, c0[r]);
      c1[r] = vfma(ak, b1, c1[r]);
      c0[r] = vfma(an, b0n, c0[r]);
      c1[r] = vfma(an, b1n, c1[r]);
    }
    a += kAStride == 0 ? kMr : 1;
    b += kNr;
    between();
  }
  store_tile(c0, c1, dst);
}
#endif

// Packed rows of the first k values: one a k, or in the pair-packed build one a pair of k's.
constexpr int64_t packed_k(int64_t k) { return kPairs ? (k + 1) / 2 : k; }

// One chunk's chains of a tile from its packed A micro-panel and B panel: the FMA loop, or with
// pair-packed operands VDPBF16PS where kDots (canonical tiles: dots_exact) and the FMAs on the pairs
// otherwise. (A template parameter: with both loops in one function the compiler spilled the
// accumulators of the VDPBF16PS loop.)
template <int kAStride, bool kDots, class Between>
[[gnu::always_inline]] inline void chunk_chains(int64_t len, const float* a, const float* b, float* dst,
                                               Between&& between) {
#if defined(LS_BF16_PAIRS)
  if constexpr (kDots) {
    chunk_dots<kAStride>(len, a, b, dst, between);
  } else {
    chunk_fmas_of_pairs<kAStride>(len, a, b, dst, between);
  }
#else
  chunk_fmas<kAStride>(len, a, b, dst, between);
#endif
}

// f(std::bool_constant<dots>{}): the tile loops with VDPBF16PS or with FMAs as constants. Builds
// without pair-packed operands have the FMA loop only.
template <class F>
decltype(auto) with_dots([[maybe_unused]] bool dots, F&& f) {
  if constexpr (kPairs) {
    if (dots) return f(std::true_type{});
  }
  return f(std::false_type{});
}

// The single chunk (K <= 64) of a tile, its fp32 chains stored into `partials` (laid out like the
// tile). The A micro-panel is k-major.
template <bool kDots>
void tile_single_chunk(int64_t K, const float* ap, const float* bp, float* partials) {
  chunk_chains<0, kDots>(K, ap, bp, partials, [] {});
}

// One kMr x kNr tile over a K block: a (K, kMr) A micro-panel — k-major (kAStride 0: kMr floats
// a k) or row by row, kAStride floats apart — times a (K, kNr) B panel, K a multiple of the chunk
// except at the end of the product; `tile` says where its sums and results go and whether this
// block is its first (fresh) and last (finish). With kInterleave each group of up to kGroup chunks
// fills a group buffer while the pending group (the previous one, of this tile or of the tile
// before) is combined between its k's, and then becomes the pending group itself. Returns what the
// combination of a tile's last group left for the element path: with kInterleave, the tile
// before's (only the pending group met by the first group can be a last one), otherwise this
// tile's.
template <int kAStride, bool kDots>
LeftVectors tile_groups(TilePipeline& pl, int64_t K, const float* ap, const float* bp, const PendingGroup& tile) {
  LeftVectors left;
  const int64_t chunks = (K + kCanonicalChunk - 1) / kCanonicalChunk;
  for (int64_t g0 = 0; g0 < chunks; g0 += kGroup) {
    PendingGroup group = tile;
    group.chunks = static_cast<int>(std::min<int64_t>(kGroup, chunks - g0));
    group.fresh = tile.fresh && g0 == 0;
    group.finish = tile.finish && g0 + group.chunks == chunks;
    float (*dst)[kMr * kNr] = pl.group[pl.filling];
    const auto fill = [&](auto&& between) {
      for (int c = 0; c < group.chunks; ++c) {
        const int64_t k0 = (g0 + c) * kCanonicalChunk;
        const float* a = ap + (kAStride == 0 ? packed_k(k0) * kMr : packed_k(k0));
        chunk_chains<kAStride, kDots>(std::min<int64_t>(kCanonicalChunk, K - k0), a, bp + packed_k(k0) * kNr,
                                      dst[c], between);
      }
    };
    if constexpr (kInterleave) {
      GroupCombiner comb(pl.pending, pl.group[pl.filling ^ 1]);
      fill([&] { comb.step(); });
      comb.finish_steps();
      const LeftVectors done = retire_pending(pl, comb.left(), group);
      if (done.vectors != 0) left = done;
    } else {
      // Each group combined right after its own FMA loop; the tile's output fetched before the
      // last one.
      if (group.finish) {
        for (uint32_t v = group_vectors(group); v != 0; v &= v - 1) {
          prefetch_output(group.out, __builtin_ctz(v));
        }
      }
      fill([] {});
      const uint32_t vectors = combine_alone(group, dst);
      if (group.finish && vectors != 0) left = {vectors, group.tile, group.sums};
    }
  }
  return left;
}

// Combines the pending group with no FMA loop beside it (after a thread's last tile).
LeftVectors drain_pending(TilePipeline& pl) {
  return retire_pending(pl, combine_alone(pl.pending, pl.group[pl.filling ^ 1]), PendingGroup{});
}

// Row strides of A micro-panels packed row by row (matmul_packed): the packed rows of a K block of
// up to kKBlock / 4, kKBlock or 2·kKBlock k's, plus a cache line so that the micro-panel's rows
// fall in different L1 sets. The short one keeps the packed A of a short K (a d_model of a few
// hundred) near its size: at the whole block's stride, A of 2048 rows and K = 128 takes 17 MiB
// instead of 4.
constexpr int kRowsShortK = packed_k(kKBlock / 4) + 16;
constexpr int kRowsBlock = packed_k(kKBlock) + 16;
constexpr int kRowsLongK = 2 * packed_k(kKBlock) + 16;

int64_t row_stride(int64_t kb) { return kb <= kKBlock / 4 ? kRowsShortK : kb <= kKBlock ? kRowsBlock : kRowsLongK; }

// f(std::integral_constant<int, a_stride>{}) for the A micro-panels' layout: k-major (a_stride 0)
// or row by row (row_stride), so that tile loops take the stride as a constant.
template <class F>
decltype(auto) with_a_stride(int64_t a_stride, F&& f) {
  switch (a_stride) {
    case 0:
      return f(std::integral_constant<int, 0>{});
    case kRowsShortK:
      return f(std::integral_constant<int, kRowsShortK>{});
    case kRowsBlock:
      return f(std::integral_constant<int, kRowsBlock>{});
    default:
      return f(std::integral_constant<int, kRowsLongK>{});
  }
}

// Output::kFast's tile: the fp32 chains over a K block (`partials`, laid out like the tile) times
// alpha, plus the tile's columns of bias (the first K block's; nullptr: none), plus beta·C (beta 0:
// C is not read), into the tile's rows x cols corner of C. round: the results rounded to bf16 as
// they are stored (the last K block's).
void store_fast(const float* partials, int rows, int cols, float* c, int64_t ldc, float alpha, const float* bias,
                float beta, bool round) {
  const VecF va = vset1(alpha), vb = vset1(beta);
  for (int r = 0; r < rows; ++r) {
    const float* p = partials + r * kNr;
    float* cr = c + r * ldc;
    int j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      VecF x = vmul(va, vload(p + j));
      if (bias != nullptr) x = vadd(x, vloadu(bias + j));
      const VecF y = beta == 0.0f ? x : vfma(vb, vloadu(cr + j), x);
      vstoreu(cr + j, round ? vround_bf16(y) : y);
    }
    for (; j < cols; ++j) {
      const float x = bias != nullptr ? alpha * p[j] + bias[j] : alpha * p[j];
      const float y = beta == 0.0f ? x : std::fma(beta, cr[j], x);
      cr[j] = round ? bf16_nearest(y) : y;
    }
  }
}

// exact_bits of kLanes elements of a tile's stored state from index i.
uint32_t stored_exact_bits(const TileSums& s, int i) {
  return exact_bits(dload(s.sum + i), dload(s.sum + i + kHalf), dload(s.big + i),
                    dload(s.big + i + kHalf), vload(s.small + i));
}

// A single chunk (K <= 64) of finite partials rounded as the canonical dot: RN(+0.0 + p) is the
// fp32 p + 0.0f; then the epilogue.
void store_row_single_chunk(const float* part, float* c, const float* bias, bool round) {
  for (int h = 0; h < 2; ++h) {
    VecF x = vadd(vload(part + h * kLanes), vzero());
    if (bias != nullptr) x = vadd(x, vloadu(bias + h * kLanes));
    vstoreu(c + h * kLanes, round ? vround_bf16(x) : x);
  }
}

// Packing scratch of the calling thread, grown on demand and reused across calls (no allocation
// in the steady state), and the sums every tile carries between K blocks, reused alike. Callers
// inside their own parallel region each get their own buffers.
thread_local std::vector<float> t_packed;
thread_local std::vector<TileSums> t_tile_sums;

TileSums* tile_sums_scratch(int64_t tiles) {
  if (t_tile_sums.size() < static_cast<size_t>(tiles)) t_tile_sums.resize(static_cast<size_t>(tiles));
  return t_tile_sums.data();
}

float* scratch(int64_t floats) {
  const auto need = static_cast<size_t>(floats + kAlign / sizeof(float));
  if (t_packed.size() < need) t_packed.resize(need);
  auto addr = reinterpret_cast<uintptr_t>(t_packed.data());
  addr = (addr + kAlign - 1) & ~static_cast<uintptr_t>(kAlign - 1);
  return reinterpret_cast<float*>(addr);
}

// dst row i (i < kLanes, stride ld_dst) <- column i of the n x kLanes block at src (row stride
// ld_src, n <= kLanes rows, rows past n read as zeros); only the first `lanes` of each dst row are
// written. The packing of operands whose packed index runs along their rows.
void transpose_block(const float* src, int64_t ld_src, int n, float* dst, int64_t ld_dst,
                     int lanes) {
  VecF r[kLanes];
  for (int i = 0; i < kLanes; ++i) r[i] = i < n ? vloadu(src + i * ld_src) : vzero();
  transpose(r);
  for (int i = 0; i < kLanes; ++i) vstore_first(dst + i * ld_dst, r[i], lanes);
}

// Panels [q0, q1) of an operand for the tiles: panel q holds the kWidth indices
// [q·kWidth, q·kWidth + kWidth) of its packed dimension (n of them in all, element i at
// x + i·s_i + k·s_k) for every k < K, written in order to out + q·K·kWidth as K rows of kWidth,
// zero past n. A's micro-panels are (kMr, sam, sak), B's panels (kNr, sbn, sbk). When the packed
// index runs along memory rows (s_k == 1), kLanes k's at a time by transposing blocks; when it is
// contiguous, row by row, each memory row visited once for all the full panels of the range (the
// rows are s_k apart, often a page or more: visiting them once a panel cost the weight gradient's
// A packing about a seventh of its product).
template <int kWidth>
void pack_panels(int64_t q0, int64_t q1, int64_t n, int64_t K, const float* x, int64_t s_i, int64_t s_k,
                 float* out) {
  const int64_t full_end = std::clamp<int64_t>(n / kWidth, q0, q1);  // [q0, full_end): full panels
  if (s_k != 1 && s_i == 1) {
    for (int64_t k = 0; k < K; ++k) {
      const float* src = x + k * s_k;
      for (int64_t q = q0; q < full_end; ++q) {
        std::memcpy(out + (q * K + k) * kWidth, src + q * kWidth, sizeof(float) * kWidth);
      }
    }
    q0 = full_end;
  }
  for (int64_t q = q0; q < q1; ++q) {
    float* dst = out + q * K * kWidth;
    const int valid = static_cast<int>(std::min<int64_t>(kWidth, n - q * kWidth));
    const float* src = x + q * kWidth * s_i;
    int64_t k = 0;
    if (s_k == 1) {
      for (; k + kLanes <= K; k += kLanes) {
        for (int h = 0; h * kLanes < kWidth; ++h) {
          transpose_block(src + h * kLanes * s_i + k, s_i, std::clamp(valid - h * kLanes, 0, kLanes),
                          dst + k * kWidth + h * kLanes, kWidth, std::min(kLanes, kWidth - h * kLanes));
        }
      }
    }
    for (; k < K; ++k) {
      for (int i = 0; i < kWidth; ++i) dst[k * kWidth + i] = i < valid ? src[i * s_i + k * s_k] : 0.0f;
    }
  }
}

// Panels packed by one call of pack_panels (or pack_pairs), which visits the memory rows once a
// call; more panels a call would write too many streams at once.
constexpr int64_t kPackBlock = 8;

#if defined(LS_BF16_PAIRS)
// What the packing of one panel saw: the smallest exponent field of its nonzero elements (255 when
// there are none, 0 when one is subnormal), and whether an element was no bf16 value (the low half
// of its fp32 bits not zero).
struct PanelKey {
  uint8_t min_exponent = 255;
  bool not_bf16 = false;
};

// Canonical tiles may use VDPBF16PS when the smallest nonzero |a| and |b| of their panels have
// exponent fields ea, eb with ea + eb >= 142. Why: a bf16 value with exponent e (unbiased) is an
// integer multiple of 2^(e - 7), so every product is a multiple of 2^(ea + eb - 254 - 14) >= 2^-126,
// and so is every sum of them; a multiple of 2^-126 rounds to one (fp32's grid is a multiple of
// 2^-126 from 2^-103 up, and below that every multiple of 2^-126 is on it). Then no input is
// subnormal (field 0 fails the test) and every nonzero product and accumulator is at least 2^-126
// in magnitude: nothing to flush, and each product below the overflow threshold is exact.
// Inf and NaN (field 255) leave the tile's result non-finite, which takes the scalar path.
bool dots_exact(const PanelKey& a, const PanelKey& b) { return a.min_exponent + b.min_exponent >= 142; }

// A panel's PanelKey, gathered over vectors of its fp32 elements; the exponents only where
// kExponents (fast mode needs no dots_exact, which halves the packing's work).
template <bool kExponents>
class KeyScan {
 public:
  void see(VecF v) {
    const __m512i u = _mm512_castps_si512(v);
    low_ = _mm512_or_si512(low_, _mm512_and_si512(u, _mm512_set1_epi32(0xffff)));
    if constexpr (!kExponents) return;
    const __mmask16 nonzero = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i field = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 23), _mm512_set1_epi32(0xff));
    min_ = _mm512_mask_min_epu32(min_, nonzero, min_, field);
  }
  void see(float x) { see(_mm512_maskz_mov_ps(1, vset1(x))); }
  PanelKey key() const {
    alignas(kAlign) uint32_t mins[kLanes], lows[kLanes];
    _mm512_store_si512(mins, min_);
    _mm512_store_si512(lows, low_);
    PanelKey k;
    for (int i = 0; i < kLanes; ++i) {
      k.min_exponent = std::min(k.min_exponent, static_cast<uint8_t>(mins[i]));
      k.not_bf16 = k.not_bf16 || lows[i] != 0;
    }
    return k;
  }

 private:
  __m512i min_ = _mm512_set1_epi32(255);
  __m512i low_ = _mm512_setzero_si512();
};

// The pair words of two vectors of fp32 bf16 values: lane j holds x_k[j]'s high half above
// x_k1[j]'s.
inline VecF pair_words(VecF xk, VecF xk1) {
  const __m512i high = _mm512_and_si512(_mm512_castps_si512(xk), _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm512_castsi512_ps(_mm512_or_si512(high, _mm512_maskz_srli_epi32(0xffff, _mm512_castps_si512(xk1), 16)));
}

// The pair words of 32 consecutive k's of one index (x[0..16) in v0, x[16..32) in v1): word j
// holds x[2j]'s high half above x[2j+1]'s.
inline VecF pair_words_along(VecF v0, VecF v1) {
  // 16-bit element 2j of the result takes x[2j+1]'s high half (element 4j + 3 of v0:v1), element
  // 2j + 1 takes x[2j]'s (element 4j + 1).
  alignas(64) static constexpr uint16_t kIndex[32] = {3,  1,  7,  5,  11, 9,  15, 13, 19, 17, 23,
                                                      21, 27, 25, 31, 29, 35, 33, 39, 37, 43, 41,
                                                      47, 45, 51, 49, 55, 53, 59, 57, 63, 61};
  return _mm512_castsi512_ps(_mm512_permutex2var_epi16(_mm512_castps_si512(v0), _mm512_load_si512(kIndex),
                                                       _mm512_castps_si512(v1)));
}

inline VecF vloadu_first(const float* p, int64_t n) {
  return n >= kLanes ? vloadu(p) : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1), p);
}

// The pair words of fp32 values that are not bf16 yet (matmul_fast's RoundAsPacked), each rounded to
// nearest even by VCVTNE2PS2BF16, whose 16-bit element i holds its second operand's lane i and
// element 16 + i its first operand's; the instruction also flushes fp32 subnormals to zero
// (matmul.hpp). As pair_words: lane j holds x_k[j]'s bf16 above x_k1[j]'s.
inline VecF rounded_pair_words(VecF xk, VecF xk1) {
  alignas(64) static constexpr uint16_t kIndex[32] = {16, 0, 17, 1, 18, 2,  19, 3,  20, 4,  21, 5,  22, 6,  23, 7,
                                                      24, 8, 25, 9, 26, 10, 27, 11, 28, 12, 29, 13, 30, 14, 31, 15};
  const auto r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(xk1, xk));
  return _mm512_castsi512_ps(_mm512_permutexvar_epi16(_mm512_load_si512(kIndex), r));
}
// As pair_words_along: element m of the conversion holds x[m], and word j takes x[2j] above
// x[2j + 1], so each 32-bit lane's halves swap (the zero-masked rotate, for the reason given at
// dwiden()).
inline VecF rounded_pair_words_along(VecF v0, VecF v1) {
  return _mm512_castsi512_ps(
      _mm512_maskz_rol_epi32(0xffff, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v1, v0)), 16));
}

// The pair words of two vectors as a panel holds them — of two k's of kLanes indices
// (pair_words), or kAlong, of 32 consecutive k's of one index (pair_words_along): rounded where
// `round`, else seen by the panel's key scan first (the words of values that are bf16 already).
template <bool kAlong, class Scan>
[[gnu::always_inline]] inline VecF packed_pair_words(VecF v0, VecF v1, bool round, Scan& scan) {
  if (round) return kAlong ? rounded_pair_words_along(v0, v1) : rounded_pair_words(v0, v1);
  scan.see(v0);
  scan.see(v1);
  return kAlong ? pair_words_along(v0, v1) : pair_words(v0, v1);
}

// A value of a strided operand as packed: where `round`, rounded to bf16 as the vector paths'
// VCVTNE2PS2BF16 rounds it (nearest even, an fp32 subnormal flushed to a zero of its sign).
inline float rounded_packed_value(float v, bool round) {
  if (!round) return v;
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : bf16_nearest(v);
}

// pack_panels for pair-packed operands: panel q holds, for every pair (k, k + 1) of k < K, the pair
// words of its kWidth indices (x's values rounded to bf16 first where `round`, no key seen: the
// panel's values are bf16 then by construction), written to
// out + q·packed_k(K)·kWidth as packed_k(K) rows of kWidth (zero past n and past K), and its
// PanelKey to keys[q].
template <int kWidth, bool kExponents>
void pack_pairs(int64_t q0, int64_t q1, int64_t n, int64_t K, const float* x, int64_t s_i, int64_t s_k,
                bool round, float* out, PanelKey* keys) {
  const int64_t K2 = packed_k(K);
  if (s_k != 1 && s_i == 1) {
    // Indices contiguous, the k's in rows s_k apart: two rows make a row of pair words.
    KeyScan<kExponents> scans[kPackBlock];
    for (int64_t p = 0; p < K2; ++p) {
      const float* row0 = x + 2 * p * s_k;
      const bool has_k1 = 2 * p + 1 < K;
      for (int64_t q = q0; q < q1; ++q) {
        for (int h = 0; h * kLanes < kWidth; ++h) {
          const int64_t i0 = q * kWidth + h * kLanes;
          const int64_t valid = std::min<int64_t>({kLanes, kWidth - h * kLanes, n - i0});
          const VecF v0 = vloadu_first(row0 + i0, valid);
          const VecF v1 = has_k1 ? vloadu_first(row0 + s_k + i0, valid) : vzero();
          vstore_first(out + (q * K2 + p) * kWidth + h * kLanes, packed_pair_words<false>(v0, v1, round, scans[q - q0]),
                       std::min(kLanes, kWidth - h * kLanes));
        }
      }
    }
    for (int64_t q = q0; q < q1; ++q) keys[q] = scans[q - q0].key();
    return;
  }
  for (int64_t q = q0; q < q1; ++q) {
    float* dst = out + q * K2 * kWidth;
    const int valid = static_cast<int>(std::min<int64_t>(kWidth, n - q * kWidth));
    const float* src = x + q * kWidth * s_i;
    KeyScan<kExponents> scan;
    if (s_k == 1) {
      // K contiguous: 32 k's of each of kLanes indices become 16 pair words, transposed into 16
      // rows of the panel.
      for (int64_t k = 0; k < K; k += 2 * kLanes) {
        for (int h = 0; h * kLanes < kWidth; ++h) {
          VecF r[kLanes];
          for (int i = 0; i < kLanes; ++i) {
            if (h * kLanes + i >= valid) {
              r[i] = vzero();
              continue;
            }
            const float* row = src + (h * kLanes + i) * s_i + k;
            const VecF v0 = vloadu_first(row, K - k), v1 = vloadu_first(row + kLanes, K - k - kLanes);
            r[i] = packed_pair_words<true>(v0, v1, round, scan);
          }
          transpose(r);
          for (int64_t p = 0; p < kLanes && k / 2 + p < K2; ++p) {
            vstore_first(dst + (k / 2 + p) * kWidth + h * kLanes, r[p], std::min(kLanes, kWidth - h * kLanes));
          }
        }
      }
    } else {
      for (int64_t p = 0; p < K2; ++p) {
        for (int i = 0; i < kWidth; ++i) {
          const float xk = i < valid ? rounded_packed_value(src[i * s_i + 2 * p * s_k], round) : 0.0f;
          const float xk1 = i < valid && 2 * p + 1 < K ? rounded_packed_value(src[i * s_i + (2 * p + 1) * s_k], round) : 0.0f;
          scan.see(xk);
          scan.see(xk1);
          dst[p * kWidth + i] = std::bit_cast<float>((std::bit_cast<uint32_t>(xk) & 0xffff0000u) |
                                                     (std::bit_cast<uint32_t>(xk1) >> 16));
        }
      }
    }
    keys[q] = scan.key();
  }
}

// pack_rows for pair-packed operands: K block kblk of A micro-panel p at
// out + (p·k_blocks + kblk)·kMr·a_stride, its row r (M's row p·kMr + r, zeros past M) the pair
// words of the block's k's (rounded to bf16 first where `round`), a_stride words after row r − 1;
// the panel's PanelKey to keys[p].
template <bool kExponents>
void pack_pair_rows(int64_t p0, int64_t p1, int64_t M, int64_t K, int64_t kb, int64_t k_blocks, const float* A,
                    int64_t sam, int64_t a_stride, bool round, float* out, PanelKey* keys) {
  for (int64_t p = p0; p < p1; ++p) {
    KeyScan<kExponents> scan;
    for (int64_t kblk = 0; kblk < k_blocks; ++kblk) {
      const int64_t k0 = kblk * kb, len = std::min(kb, K - k0);
      float* dst = out + (p * k_blocks + kblk) * kMr * a_stride;
      for (int r = 0; r < kMr; ++r) {
        const int64_t m = p * kMr + r;
        float* row_out = dst + r * a_stride;
        if (m >= M) {
          std::fill(row_out, row_out + packed_k(len), 0.0f);
          continue;
        }
        const float* row = A + m * sam + k0;
        for (int64_t k = 0; k < len; k += 2 * kLanes) {
          const VecF v0 = vloadu_first(row + k, len - k), v1 = vloadu_first(row + k + kLanes, len - k - kLanes);
          vstore_first(row_out + k / 2, packed_pair_words<true>(v0, v1, round, scan),
                       static_cast<int>(std::min<int64_t>(kLanes, packed_k(len) - k / 2)));
        }
      }
    }
    keys[p] = scan.key();
  }
}
#endif

#if !defined(LS_BF16_PAIRS)
// A micro-panels [p0, p1) row by row (A's K contiguous, rows sam apart): K block kblk of panel p
// at out + (p·k_blocks + kblk)·kMr·a_stride, its row r (of M's row p·kMr + r, zeros past M)
// a_stride floats after row r − 1.
void pack_rows(int64_t p0, int64_t p1, int64_t M, int64_t K, int64_t kb, int64_t k_blocks,
               const float* A, int64_t sam, int64_t a_stride, float* out) {
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t kblk = 0; kblk < k_blocks; ++kblk) {
      const int64_t k0 = kblk * kb, len = std::min(kb, K - k0);
      float* dst = out + (p * k_blocks + kblk) * kMr * a_stride;
      for (int r = 0; r < kMr; ++r) {
        const int64_t m = p * kMr + r;
        if (m < M) {
          std::memcpy(dst + r * a_stride, A + m * sam + k0, sizeof(float) * static_cast<size_t>(len));
        } else {
          std::fill(dst + r * a_stride, dst + r * a_stride + len, 0.0f);
        }
      }
    }
  }
}
#endif

// First index of part `who` when n indices are split into `parts` contiguous parts: the threads'
// shares in run_product, and the ranges of A panels the tile order of matmul_packed follows so
// that a thread's share of tiles reads the A panels of its own share.
int64_t part_start(int64_t n, int64_t who, int64_t parts) { return who * n / parts; }

// The threads run_product uses: the team's when `wide` and outside an active parallel region,
// otherwise one. Entering a region costs libgomp a team setup (futex calls and an allocation,
// about 2 us) even when its if clause is false or it is nested, and attention calls these
// products inside its own loop over heads, some thousands of times a step.
int64_t product_threads(bool wide) {
  return wide && !omp_in_parallel() ? omp_get_max_threads() : 1;
}

// Readiness of the packed panels of the parallel product in flight (A panels first, then B):
// panel i is packed once ready(i) holds the product's stamp, stored with release order by the
// thread that packed it. One per calling thread: a product inside a parallel region runs serially
// and uses none.
class PanelFlags {
 public:
  void start(int64_t panels) {
    if (panels > capacity_) {
      flags_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(panels));
      capacity_ = panels;
    }
    ++stamp_;
  }
  void set(int64_t i) { flags_[i].store(stamp_, std::memory_order_release); }
  // Spins until panel i is packed, yielding the core after a while: with more threads than cores
  // (ranks oversubscribed) its packer may be waiting for this one's core.
  void wait(int64_t i) const {
    for (int spins = 0; flags_[i].load(std::memory_order_acquire) != stamp_; ++spins) {
      if (spins < 4096) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> flags_;
  int64_t capacity_ = 0;
  uint64_t stamp_ = 0;
};

// The tiles of a product of one K block, claimed kClaim at a time: a thread claims from the front
// of its own contiguous share (the tiles that read the A panels it packed), then from the rest of
// the other shares. Two vCPUs of a shared host do not run at the same speed (the host's other
// load), and with a fixed split the faster thread waited at the region's end for the slower one:
// 8% of a bf16 step's cycles spun in libgomp's barrier. Which thread runs a tile changes no bit.
// One per calling thread, like PanelFlags.
class TileClaims {
 public:
  void start(int64_t tiles, int64_t shares) {
    if (shares > capacity_) {
      shares_ = std::make_unique<Share[]>(static_cast<size_t>(shares));
      capacity_ = shares;
    }
    count_ = shares;
    for (int64_t i = 0; i < shares; ++i) {
      shares_[i].next.store(part_start(tiles, i, shares), std::memory_order_relaxed);
      shares_[i].end = part_start(tiles, i + 1, shares);
    }
  }
  // Runs run_tile(t) for each tile this thread claims: its own share `me` first, then the others.
  // Any number of threads up to the shares may call it; together they run every tile once.
  template <class RunTile>
  void run(int64_t me, const RunTile& run_tile) {
    for (int64_t k = 0; k < count_; ++k) {
      Share& share = shares_[(me + k) % count_];
      for (;;) {
        const int64_t t0 = share.next.fetch_add(kClaim, std::memory_order_relaxed);
        if (t0 >= share.end) break;
        for (int64_t t = t0; t < std::min(t0 + kClaim, share.end); ++t) run_tile(t);
      }
    }
  }

 private:
  static constexpr int64_t kClaim = 8;
  struct alignas(kAlign) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Share[]> shares_;
  int64_t capacity_ = 0, count_ = 0;
};

// Panels [first, end) packed by pack(p0, p1) in blocks of kPackBlock, packed(p) called for each
// after its block.
template <class Pack, class Packed>
void pack_in_blocks(const Pack& pack, int64_t first, int64_t end, const Packed& packed) {
  for (int64_t p0 = first; p0 < end; p0 += kPackBlock) {
    const int64_t p1 = std::min(end, p0 + kPackBlock);
    pack(p0, p1);
    for (int64_t p = p0; p < p1; ++p) packed(p);
  }
}

// The loops of a product: pack_a(p0, p1) and pack_b(q0, q1) over every A and B panel, then
// tile(kblock, t) for every tile of each K block in turn; panels_of(t) names the (A, B) panels
// tile t reads. On several threads, one OpenMP region without a barrier: each thread packs an
// equal share of the A and of the B panels — the operand it shares with the others first
// (B when split_a, the threads' tiles then covering ranges of A panels, which the same thread
// packs) — and runs its share of the tiles, waiting before a tile's first K block only for
// panels not packed yet. (A barrier after the packing and after each loop had the faster thread
// wait for the slower one several times a product.) With one K block a thread that is done with
// its share claims the rest of the others' (TileClaims); with several, the tiles of a thread are
// the same in every K block, so the sums they carry between blocks stay with it. Each thread
// calls share_end() after its last tile.
template <class PackA, class PackB, class Tile, class Panels, class ShareEnd>
void run_product(bool wide, bool split_a, int64_t a_panels, int64_t b_panels, int64_t k_blocks,
                 int64_t tiles, const PackA& pack_a, const PackB& pack_b, const Tile& tile,
                 const Panels& panels_of, const ShareEnd& share_end) {
  if (product_threads(wide) > 1) {
    thread_local PanelFlags flags_of_caller;
    PanelFlags& flags = flags_of_caller;
    flags.start(a_panels + b_panels);
    thread_local TileClaims claims_of_caller;
    TileClaims& claims = claims_of_caller;
    const int64_t threads_wanted = product_threads(wide);
    if (k_blocks == 1) claims.start(tiles, threads_wanted);
#pragma omp parallel num_threads(threads_wanted)
    {
      const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
      const auto first = [&](int64_t n, int64_t who) { return part_start(n, who, threads); };
      // This thread's share of one operand's panels (flags from index `flag0`).
      const auto pack_share = [&](const auto& pack, int64_t panels, int64_t flag0) {
        pack_in_blocks(pack, first(panels, me), first(panels, me + 1),
                       [&](int64_t p) { flags.set(flag0 + p); });
      };
      if (split_a) {
        pack_share(pack_b, b_panels, a_panels);
        pack_share(pack_a, a_panels, 0);
      } else {
        pack_share(pack_a, a_panels, 0);
        pack_share(pack_b, b_panels, a_panels);
      }
      const auto first_block_tile = [&](int64_t t) {
        const auto [p, q] = panels_of(t);
        flags.wait(p);
        flags.wait(a_panels + q);
        tile(0, t);
      };
      if (k_blocks == 1) {
        claims.run(me, first_block_tile);
      } else {
        for (int64_t kblock = 0; kblock < k_blocks; ++kblock) {
          for (int64_t t = first(tiles, me); t < first(tiles, me + 1); ++t) {
            if (kblock == 0) {
              first_block_tile(t);
            } else {
              tile(kblock, t);
            }
          }
        }
      }
      share_end();
    }
    return;
  }
  pack_in_blocks(pack_a, 0, a_panels, [](int64_t) {});
  pack_in_blocks(pack_b, 0, b_panels, [](int64_t) {});
  for (int64_t kblock = 0; kblock < k_blocks; ++kblock) {
    for (int64_t t = 0; t < tiles; ++t) tile(kblock, t);
  }
  share_end();
}

// Where a tile's results go (one of the Output modes).
struct Sink {
  float* C = nullptr;
  int64_t ldc = 0;
  MatmulEpilogue epilogue;
  ExactAccumulator* acc = nullptr;
  int64_t offset = 0;
  float alpha = 1.0f, beta = 0.0f;  // Output::kFast
  RoundAsPacked rounds;             // Output::kFast of pair-packed operands: rounded to bf16 as packed
};

// The scalar specification for one element of Output::kRound, then the epilogue.
void store_element_spec(const Sink& sink, int64_t m, int64_t n, float dot) {
  float v = dot;
  if (sink.epilogue.col_bias != nullptr) v = v + sink.epilogue.col_bias[n];
  sink.C[m * sink.ldc + n] = sink.epilogue.round_bf16 ? bf16_nearest(v) : v;
}

template <Output kOut>
void matmul_packed(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak,
                   const float* B, int64_t sbk, int64_t sbn, const Sink& sink) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0, "M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (kOut == Output::kExact && K == 0) return;  // no chunk: nothing to add
  const int64_t a_panels = (M + kMr - 1) / kMr;
  const int64_t b_panels = (N + kNr - 1) / kNr;
  // With one chunk there is nothing to combine: every mode works on the chains themselves.
  const bool single_chunk = K <= kCanonicalChunk;

  // A long K (over 2·kKBlock) runs in blocks of kKBlock: each tile's sums carry from one block to
  // the next (the chunks still meet its sums in order, so the bits do not change), and a block's
  // slices of an A micro-panel and a B panel stay in L1 and L2 instead of streaming from memory
  // for every tile.
  const int64_t kb = single_chunk || K <= 2 * kKBlock ? K : kKBlock;
  const int64_t k_blocks = kb == K ? 1 : (K + kb - 1) / kb;  // one block also when K = 0
  // A with contiguous K and few B panels (N <= 16·kNr) is packed row by row, each K block of a
  // micro-panel kMr rows a_stride apart: copies, where a k-major micro-panel needs transposes.
  // Broadcasting from kMr rows costs the FMA loop about 2%; a micro-panel's transposes serve all
  // the B panels, so row by row pays only where they are few (measured: K >= 768 with N = 256 or
  // 512 took 2-12% less time, N >= 1024 2-3% more, single chunks more).
  const int64_t a_stride =
      sak == 1 && !single_chunk && N <= 16 * kNr ? row_stride(kb) : 0;
  // B panels are read with aligned loads: start them on a cache line after A's panels.
  constexpr int64_t kLineFloats = kAlign / static_cast<int64_t>(sizeof(float));
  const int64_t KP = packed_k(K);  // packed rows of a panel
  const int64_t a_floats = a_stride != 0 ? a_panels * k_blocks * kMr * a_stride : a_panels * kMr * KP;
  const int64_t a_size = (a_floats + kLineFloats - 1) / kLineFloats * kLineFloats;
  float* apack = scratch(a_size + b_panels * kNr * KP);
  float* bpack = apack + a_size;
#if defined(LS_BF16_PAIRS)
  constexpr bool kExponents = kOut != Output::kFast;  // for dots_exact
  thread_local std::vector<PanelKey> keys_of_caller;  // A panels', then B panels'
  std::vector<PanelKey>& keys = keys_of_caller;
  if (keys.size() < static_cast<size_t>(a_panels + b_panels)) keys.resize(static_cast<size_t>(a_panels + b_panels));
#endif
  // Tiles run in blocks of nb B panels (about 512 KiB of packed B, which stays in L2): inside a
  // block, A micro-panel by A micro-panel, each meeting the block's panels in turn while it stays
  // in L1, so that consecutive tiles write neighbouring parts of the same output rows. Threads
  // take contiguous ranges of this order. When A is the larger operand (M >= N) the order runs
  // first over `ranges` contiguous ranges of A panels, one a thread: each thread then reads its
  // share of packed A rather than all of it (a thread per B block read the whole of A, from the
  // other core's cache for the half it did not pack); otherwise each thread takes B blocks.
  constexpr int64_t kBlockBytes = int64_t{1} << 19;
  const int64_t nb = std::max<int64_t>(1, kBlockBytes / (packed_k(kb) * kNr * int64_t{sizeof(float)} + 1));
  const int64_t tiles = a_panels * b_panels;
  const bool wide = M * N * K > (int64_t{1} << 18);
  const int64_t ranges = M >= N ? std::min(a_panels, product_threads(wide)) : 1;
  TileSums* carried = kOut != Output::kFast && k_blocks > 1 ? tile_sums_scratch(tiles) : nullptr;
  // The (A panel, B panel) of tile t.
  const auto panels_of = [&](int64_t t) {
    int64_t rg = 0;  // the range of tile t: A panels [ip0, ip1)
    while (t >= part_start(a_panels, rg + 1, ranges) * b_panels) ++rg;
    const int64_t ip0 = part_start(a_panels, rg, ranges), ip1 = part_start(a_panels, rg + 1, ranges);
    const int64_t tr = t - ip0 * b_panels, block_tiles = (ip1 - ip0) * nb;
    const int64_t jb = tr / block_tiles;
    const int64_t width = std::min(nb, b_panels - jb * nb);
    const int64_t in_block = tr - jb * block_tiles;
    return std::pair{ip0 + in_block / width, jb * nb + in_block % width};
  };
  // The vectors a tile's last group left go element by element: an exact sum rounded once (added
  // at once), any other element recomputed by the scalar specification (its chunk partials added
  // one by one).
  const auto element_path = [&](const LeftVectors& left) {
    if (left.vectors == 0) return;
    const auto [ip, jp] = panels_of(left.tile);
    const int cols = static_cast<int>(std::min<int64_t>(kNr, N - jp * kNr));
    for (uint32_t v = left.vectors; v != 0; v &= v - 1) {
      const int i = __builtin_ctz(v) * kLanes;
      const int r = i / kNr, j0 = i % kNr;
      const uint32_t exact = stored_exact_bits(*left.sums, i);
      const int64_t m = ip * kMr + r;
      for (int j = j0; j < std::min(cols, j0 + kLanes); ++j) {
        const int64_t n = jp * kNr + j;
        const bool fast = (exact >> (j - j0)) & 1;
        const double sum = left.sums->sum[i + j - j0];
        if constexpr (kOut == Output::kRound) {
          store_element_spec(sink, m, n,
                             fast ? static_cast<float>(sum) : canonical_dot(A + m * sam, sak, B + n * sbn, sbk, K));
        } else if (fast) {
          sink.acc->add(static_cast<size_t>(sink.offset + m * N + n), sum);
        } else {
          for (int64_t k0 = 0; k0 < K; k0 += kCanonicalChunk) {
            const int64_t len = std::min<int64_t>(kCanonicalChunk, K - k0);
            sink.acc->add(static_cast<size_t>(sink.offset + m * N + n),
                          chunk_dot(A + m * sam + k0 * sak, sak, B + n * sbn + k0 * sbk, sbk, len));
          }
        }
      }
    }
  };
  const auto tile = [&](int64_t kblock, int64_t t) {
    const int64_t kb0 = kblock * kb, kb_len = std::min(kb, K - kb0);
    const bool last_block = kblock + 1 == k_blocks;
    const auto [ip, jp] = panels_of(t);
    const int rows = static_cast<int>(std::min<int64_t>(kMr, M - ip * kMr));
    const int cols = static_cast<int>(std::min<int64_t>(kNr, N - jp * kNr));
    const float* ap = a_stride != 0 ? apack + (ip * k_blocks + kblock) * kMr * a_stride
                                    : apack + ip * kMr * KP + packed_k(kb0) * kMr;
    const float* bp = bpack + jp * kNr * KP + packed_k(kb0) * kNr;
#if defined(LS_BF16_PAIRS)
    const bool dots = kOut == Output::kFast || dots_exact(keys[ip], keys[a_panels + jp]);
#else
    const bool dots = false;
#endif
    if constexpr (kOut == Output::kFast) {
      alignas(kAlign) float part[kMr * kNr];
      with_a_stride(a_stride, [&](auto stride) {
        with_dots(dots, [&](auto d) { chunk_chains<stride, d>(kb_len, ap, bp, part, [] {}); });
      });
      const float* bias = kblock == 0 && sink.epilogue.col_bias ? sink.epilogue.col_bias + jp * kNr : nullptr;
      store_fast(part, rows, cols, sink.C + ip * kMr * sink.ldc + jp * kNr, sink.ldc, sink.alpha, bias,
                 kblock == 0 ? sink.beta : 1.0f, sink.epilogue.round_bf16 && last_block);
      return;
    }
    if (kOut == Output::kPartials || single_chunk) {
      alignas(kAlign) float part[kMr * kNr];
      with_dots(dots, [&](auto d) { tile_single_chunk<d>(K, ap, bp, part); });
      for (int r = 0; r < rows; ++r) {
        const int64_t m = ip * kMr + r;
        const float* pr = part + r * kNr;
        if constexpr (kOut == Output::kPartials) {
          float* c = sink.C + m * sink.ldc + jp * kNr;
          for (int j = 0; j < cols; ++j) c[j] = pr[j];
        } else if constexpr (kOut == Output::kExact) {
          // The chunk partial itself, as ChunkCombiner's contract adds it.
          for (int j = 0; j < cols; ++j) {
            sink.acc->add(static_cast<size_t>(sink.offset + m * N + jp * kNr + j), pr[j]);
          }
        } else {
          const float* bias = sink.epilogue.col_bias ? sink.epilogue.col_bias + jp * kNr : nullptr;
          if (cols == kNr && vall_finite(vload(pr)) && vall_finite(vload(pr + kLanes))) {
            store_row_single_chunk(pr, sink.C + m * sink.ldc + jp * kNr, bias, sink.epilogue.round_bf16);
            continue;
          }
          for (int j = 0; j < cols; ++j) {
            const int64_t n = jp * kNr + j;
            store_element_spec(sink, m, n,
                               std::isfinite(pr[j]) ? pr[j] + 0.0f
                                                    : canonical_dot(A + m * sam, sak, B + n * sbn, sbk, K));
          }
        }
      }
      return;
    }
    TilePipeline& pl = tile_pipeline();
    PendingGroup group;
    group.fresh = kblock == 0;
    group.finish = last_block;
    group.tile = t;
    if (carried != nullptr) {
      group.sums = &carried[t];
    } else {
      // The pending group of the tile before uses the other one.
      group.sums = pl.pending.sums == &pl.own[0] ? &pl.own[1] : &pl.own[0];
    }
    if (last_block) {
      TileOut& out = group.out;
      out.rows = rows;
      out.cols = cols;
      if constexpr (kOut == Output::kRound) {
        out.c = sink.C + ip * kMr * sink.ldc + jp * kNr;
        out.ldc = sink.ldc;
        out.bias = sink.epilogue.col_bias ? sink.epilogue.col_bias + jp * kNr : nullptr;
        out.round_bf16 = sink.epilogue.round_bf16;
      } else {
        out.acc = sink.acc;
        out.index = static_cast<size_t>(sink.offset + ip * kMr * N + jp * kNr);
        out.ld_acc = N;
      }
    }
    element_path(with_a_stride(a_stride, [&](auto stride) {
      return with_dots(dots, [&](auto d) { return tile_groups<stride, d>(pl, kb_len, ap, bp, group); });
    }));
  };
  run_product(wide, ranges > 1, a_panels, b_panels, k_blocks, tiles,
              [&](int64_t p0, int64_t p1) {
#if defined(LS_BF16_PAIRS)
                if (a_stride != 0) {
                  pack_pair_rows<kExponents>(p0, p1, M, K, kb, k_blocks, A, sam, a_stride, sink.rounds.a, apack,
                                             keys.data());
                } else {
                  pack_pairs<kMr, kExponents>(p0, p1, M, K, A, sam, sak, sink.rounds.a, apack, keys.data());
                }
#else
                if (a_stride != 0) {
                  pack_rows(p0, p1, M, K, kb, k_blocks, A, sam, a_stride, apack);
                } else {
                  pack_panels<kMr>(p0, p1, M, K, A, sam, sak, apack);
                }
#endif
              },
              [&](int64_t q0, int64_t q1) {
#if defined(LS_BF16_PAIRS)
                pack_pairs<kNr, kExponents>(q0, q1, N, K, B, sbn, sbk, sink.rounds.b, bpack, keys.data() + a_panels);
#else
                pack_panels<kNr>(q0, q1, N, K, B, sbn, sbk, bpack);
#endif
              },
              tile, panels_of, [&] {
                if (kOut != Output::kFast && !single_chunk) element_path(drain_pending(tile_pipeline()));
              });
#if defined(LS_BF16_PAIRS)
  for (int64_t p = 0; p < a_panels + b_panels; ++p) {
    LS_CHECK(!keys[p].not_bf16, "a product of bf16 operands: ", p < a_panels ? "A" : "B",
             " holds a value that is not bf16 (its fp32 bits' low half is not zero), in panel ",
             p < a_panels ? p : p - a_panels, " (M=", M, " N=", N, " K=", K, ")");
  }
#endif
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

void matmul_fast_packed(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t sam,
                        int64_t sak, const float* B, int64_t sbk, int64_t sbn, float beta, float* C,
                        int64_t ldc, MatmulEpilogue epilogue, RoundAsPacked rounds) {
  Sink sink;
  sink.rounds = rounds;
  sink.C = C;
  sink.ldc = ldc;
  sink.alpha = alpha;
  sink.beta = beta;
  sink.epilogue = epilogue;
  matmul_packed<Output::kFast>(M, N, K, A, sam, sak, B, sbk, sbn, sink);
}

void matmul_chunks_exact_packed(int64_t M, int64_t N, int64_t K, ExactAccumulator& acc,
                                int64_t offset, const float* A, int64_t sam, int64_t sak,
                                const float* B, int64_t sbk, int64_t sbn) {
  Sink sink;
  sink.acc = &acc;
  sink.offset = offset;
  matmul_packed<Output::kExact>(M, N, K, A, sam, sak, B, sbk, sbn, sink);
}

void release_packing_scratch() {
  std::vector<float>().swap(t_packed);
  std::vector<TileSums>().swap(t_tile_sums);
}

}  // namespace lockstep::cpu::LS_ISA_NS
