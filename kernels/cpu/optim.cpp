// AdamW update, gradient sum of squares and gradient scaling on the CPU.
//
// adamw_update and scale_inplace are elementwise, with no mode: every element is the same fixed
// sequence of fp32 operations (no FMA, IEEE sqrt and division), so the bits do not depend on
// threads or vector width. adamw_update writes that sequence with AVX2 intrinsics, eight elements
// at a time (the compiler left the divisions and the square root scalar), and the scalar code of
// adamw_element for the last n % 8. grad_sumsq_accumulate is a reduction: canonical mode follows
// canonical.hpp exactly (chunks from the buffer's first element, FMA chain per chunk — eight
// chunks' chains side by side in the lanes of a vector — partials combined exactly by the
// caller's ChunkCombiner); fast mode sums g² in double, threads taking
// blocks.
//
// Not here: clipping policy and learning-rate schedules (src/optim), ZeRO sharding (src/parallel).
#include "kernels/ops/optim.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd_math.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

// into += from, exactly. Both hold exact sums of fp32 values (a double that add_exact kept exact,
// or a SuperAccumulator), so the merged sum is exact whatever the order of merges.
void merge_exact(ChunkCombiner& into, const ChunkCombiner& from) {
  if (!from.spilled) {
    if (!into.spilled && add_exact(into.sum, from.sum)) return;
    if (!into.spilled) {
      into.acc.add(into.sum);
      into.spilled = true;
    }
    into.acc.add(from.sum);
    return;
  }
  if (!into.spilled) {
    into.acc.add(into.sum);
    into.spilled = true;
  }
  into.acc.add(from.acc);
}

// One element of the update, in the order of kernels/ops/optim.hpp.
inline void adamw_element(const AdamWParams& h, float one_minus_b1, float one_minus_b2, float& param, float& m,
                          float& v, float g) {
  const float mi = h.beta1 * m + one_minus_b1 * g;
  const float vi = h.beta2 * v + one_minus_b2 * (g * g);
  const float mhat = mi / h.bc1;
  const float vhat = vi / h.bc2;
  const float p = param;
  param = p - h.lr * (mhat / (std::sqrt(vhat) + h.eps) + h.weight_decay * p);
  m = mi;
  v = vi;
}

}  // namespace

void adamw_update(int64_t n, AdamWParams h, float* param, float* m, float* v, const float* grad) {
  LS_REQUIRE(n >= 0, "adamw_update: n (", n, ") must be >= 0");
  // 1 - beta is exact for beta in [0.5, 1] (Sterbenz); it is computed once, as documented.
  const float one_minus_b1 = 1.0f - h.beta1;
  const float one_minus_b2 = 1.0f - h.beta2;
  const int64_t nv = n / 8;
  // Biases and norm weights are too small to pay for a fork and join.
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 14))
  for (int64_t k = 0; k < nv; ++k) {
    const int64_t i = k * 8;
    // adamw_element's operations on eight lanes, each rounded as there.
    const __m256 g = _mm256_loadu_ps(grad + i);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(h.beta1), _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(_mm256_set1_ps(one_minus_b1), g));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(h.beta2), _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_set1_ps(one_minus_b2), _mm256_mul_ps(g, g)));
    const __m256 mhat = _mm256_div_ps(mi, _mm256_set1_ps(h.bc1));
    const __m256 vhat = _mm256_div_ps(vi, _mm256_set1_ps(h.bc2));
    const __m256 p = _mm256_loadu_ps(param + i);
    const __m256 step = _mm256_add_ps(
        _mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), _mm256_set1_ps(h.eps))),
        _mm256_mul_ps(_mm256_set1_ps(h.weight_decay), p));
    _mm256_storeu_ps(param + i, _mm256_sub_ps(p, _mm256_mul_ps(_mm256_set1_ps(h.lr), step)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  for (int64_t i = nv * 8; i < n; ++i) adamw_element(h, one_minus_b1, one_minus_b2, param[i], m[i], v[i], grad[i]);
}

void grad_sumsq_accumulate(Mode mode, int64_t n, ChunkCombiner& acc, const float* grad) {
  LS_REQUIRE(n >= 0, "grad_sumsq_accumulate: n (", n, ") must be >= 0");
  if (mode == Mode::kCanonical) {
    // Chunk partials are computed on whichever thread owns the chunk; each thread combines its
    // partials exactly and the per-thread exact sums merge exactly: the result is RN(exact sum)
    // however the chunks were distributed. Threads take groups of eight whole chunks, whose
    // chains run side by side (simd::load_transposed8); the chunks after the last whole group run
    // chunk_dot itself.
    const int64_t full = n / kCanonicalChunk, groups = full / 8;
#pragma omp parallel
    {
      ChunkCombiner local;
#pragma omp for schedule(static)
      for (int64_t k = 0; k < groups; ++k) {
        const float* g = grad + k * 8 * kCanonicalChunk;
        simd::V8 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < kCanonicalChunk; i += 8) {
          simd::V8 r[8];
          simd::load_transposed8(g + i, kCanonicalChunk, r);
          for (const simd::V8& x : r) acc = _mm256_fmadd_ps(x, x, acc);
        }
        alignas(32) float partial[8];
        _mm256_store_ps(partial, acc);
        for (float p : partial) local.add(p);
      }
#pragma omp single nowait
      for (int64_t i0 = groups * 8 * kCanonicalChunk; i0 < n; i0 += kCanonicalChunk) {
        local.add(chunk_dot(grad + i0, 1, grad + i0, 1, std::min(kCanonicalChunk, n - i0)));
      }
#pragma omp critical(lockstep_grad_sumsq)
      merge_exact(acc, local);
    }
    return;
  }
  // Fast: blocks of 4096 elements, each summed in eight double lanes in a fixed order (products of
  // fp32 values are exact in double), the threads' block sums added in any order; one rounding to
  // fp32 when handed to the combiner.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double s = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > 4 * kBlock)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = b * kBlock;
    for (; i + 8 <= end; i += 8) {
      for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(grad[i + j]) * grad[i + j];
    }
    for (; i < end; ++i) lane[0] += static_cast<double>(grad[i]) * grad[i];
    s += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  acc.add(static_cast<float>(s));
}

void scale_inplace(int64_t n, float* g, float scale) {
  LS_REQUIRE(n >= 0, "scale_inplace: n (", n, ") must be >= 0");
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * scale;
}

}  // namespace lockstep::cpu
