#include "kernels/cpu/matmul_fp8_accumulation.hpp"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/bf16_bits.hpp"
#include "kernels/ops/fp8_accumulation.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

constexpr int64_t kLanes = 8;  // output columns per block: two vectors of four doubles

// 2^e for the lanes' exponents e (within double's normal range).
inline __m256d pow2(__m256i e) {
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52));
}

// The unbiased exponent of each lane's |x| (x normal, ≥ 0); lanes where x == 0 get 0.
inline __m256i exponent(__m256d x) {
  const __m256i e = _mm256_sub_epi64(_mm256_srli_epi64(_mm256_castpd_si256(x), 52), _mm256_set1_epi64x(1023));
  return _mm256_andnot_si256(_mm256_castpd_si256(_mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_EQ_OQ)), e);
}

inline __m256d cut(__m256d x, __m256d inverse, __m256d q) {
  return _mm256_mul_pd(_mm256_round_pd(_mm256_mul_pd(x, inverse), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), q);
}

inline __m256d magnitude(__m256d x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }

// fp8_limited_interval for four lanes: products a[k·sak]·b[k·sbk + lane], k < n (B's lanes
// adjacent). False where some product or the accumulator is not finite (the caller then uses the
// scalar model).
inline bool limited_interval4(const float* a, int64_t sak, const float* b, int64_t sbk, int64_t n, __m256d& result) {
  const __m256d inf = _mm256_set1_pd(__builtin_inf());
  const __m256i fraction = _mm256_set1_epi64x(kFp8AccumulatorFractionBits);
  __m256d acc = _mm256_setzero_pd();
  __m256d finite = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  for (int64_t g0 = 0; g0 < n; g0 += kFp8MmaGroup) {
    const int64_t len = std::min(kFp8MmaGroup, n - g0);
    __m256d p[kFp8MmaGroup];
    __m256d top = magnitude(acc);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = g0 + i;
      p[i] = _mm256_mul_pd(_mm256_set1_pd(static_cast<double>(a[k * sak])), _mm256_cvtps_pd(_mm_loadu_ps(b + k * sbk)));
      const __m256d m = magnitude(p[i]);
      finite = _mm256_and_pd(finite, _mm256_cmp_pd(m, inf, _CMP_LT_OQ));
      top = _mm256_max_pd(top, m);
    }
    if (_mm256_movemask_pd(finite) != 0xf) return false;
    const __m256i e = _mm256_sub_epi64(exponent(top), fraction);
    const __m256d inverse = pow2(_mm256_sub_epi64(_mm256_setzero_si256(), e)), q = pow2(e);
    __m256d sum = cut(acc, inverse, q);
    for (int64_t i = 0; i < len; ++i) sum = _mm256_add_pd(sum, cut(p[i], inverse, q));
    const __m256d size = magnitude(sum);
    const __m256i es = _mm256_sub_epi64(exponent(size), fraction);
    const __m256d normalized = cut(sum, pow2(_mm256_sub_epi64(_mm256_setzero_si256(), es)), pow2(es));
    // A zero sum (of either sign) leaves +0, as the model does.
    acc = _mm256_andnot_pd(_mm256_cmp_pd(size, _mm256_setzero_pd(), _CMP_EQ_OQ), normalized);
  }
  result = acc;
  return true;
}

// Where one element's value goes once its promotion-interval partials are known.
struct Element {
  ChunkCombiner canonical;
  float promoted = 0.0f;
};

void store(Mode mode, const Fp8HopperOutput& out, int64_t m, int64_t n, const Element& e) {
  const float dot = mode == Mode::kCanonical ? e.canonical.finish() : e.promoted;
  float& c = out.f32[m * out.ldc + n];
  float v = out.onto ? c + dot : dot;
  if (out.col_bias != nullptr) v = v + out.col_bias[n];
  c = out.round_bf16 ? bf16_nearest(v) : v;
}

void add_partial(Mode mode, const Fp8HopperOutput& out, int64_t m, int64_t N, int64_t n, Element& e, float partial) {
  if (out.exact != nullptr) {
    out.exact->add(static_cast<size_t>(out.offset + m * N + n), partial);
  } else if (mode == Mode::kCanonical) {
    e.canonical.add(partial);
  } else {
    e.promoted += partial;
  }
}

// Row m, columns [n0, n0 + width) of the product, width ≤ kLanes: whole blocks in the vector
// lanes as long as their products are finite, the rest by the scalar model, interval by interval
// (the two agree bit for bit where both apply).
void block(Mode mode, int64_t N, int64_t K, const float* a, int64_t sak, const float* B, int64_t sbk,
           const Fp8HopperOutput& out, int64_t m, int64_t n0, int64_t width) {
  Element elements[kLanes];
  int64_t k0 = 0;
  for (; width == kLanes && k0 < K; k0 += kFp8PromotionInterval) {
    const int64_t len = std::min(kFp8PromotionInterval, K - k0);
    const float* b = B + k0 * sbk + n0;
    __m256d lo, hi;
    if (!limited_interval4(a + k0 * sak, sak, b, sbk, len, lo) ||
        !limited_interval4(a + k0 * sak, sak, b + 4, sbk, len, hi)) {
      break;
    }
    float partial[kLanes];
    _mm_storeu_ps(partial, _mm256_cvtpd_ps(lo));
    _mm_storeu_ps(partial + 4, _mm256_cvtpd_ps(hi));
    for (int64_t j = 0; j < kLanes; ++j) add_partial(mode, out, m, N, n0 + j, elements[j], partial[j]);
  }
  for (int64_t j = 0; j < width; ++j) {
    for (int64_t k = k0; k < K; k += kFp8PromotionInterval) {
      const int64_t len = std::min(kFp8PromotionInterval, K - k);
      const float* b = B + k * sbk + n0 + j;
      add_partial(mode, out, m, N, n0 + j, elements[j],
                  static_cast<float>(fp8_limited_interval(a + k * sak, sak, b, sbk, len)));
    }
  }
  if (out.f32 == nullptr) return;
  for (int64_t j = 0; j < width; ++j) store(mode, out, m, n0 + j, elements[j]);
}

// X (rows × cols at X[r·sr + c·sc]) copied row-major into buf, grown as needed.
const float* packed(std::vector<float>& buf, int64_t rows, int64_t cols, const float* X, int64_t sr, int64_t sc) {
  if (buf.size() < static_cast<size_t>(rows * cols)) buf.resize(static_cast<size_t>(rows * cols));
  float* p = buf.data();
#pragma omp parallel for schedule(static) if (rows * cols > (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] = X[r * sr + c * sc];
  }
  return p;
}

}  // namespace

void matmul_fp8_hopper(Mode mode, int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak,
                       const float* B, int64_t sbk, int64_t sbn, const Fp8HopperOutput& out) {
  LS_CHECK((out.f32 != nullptr) != (out.exact != nullptr), "matmul_fp8_hopper: one output, fp32 or exact");
  // The lanes read B's columns side by side: a B whose columns are not adjacent (fprop's weight)
  // is packed row-major first, into a buffer the calling thread keeps (as matmul.isa.cpp packs).
  if (sbn != 1) {
    thread_local std::vector<float> packed_b;
    B = packed(packed_b, K, N, B, sbk, sbn);
    sbk = N;
  }
  const int64_t blocks = (N + kLanes - 1) / kLanes;
#pragma omp parallel for collapse(2) schedule(static) if (M * N * K > (int64_t{1} << 16))
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * kLanes;
      block(mode, N, K, A + m * sam, sak, B, sbk, out, m, n0, std::min(kLanes, N - n0));
    }
  }
}

}  // namespace lockstep::cpu
