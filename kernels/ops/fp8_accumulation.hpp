// How an FP8 GEMM accumulates its products (LinearShape::accumulation, kernels/ops/linear.hpp).
//
//   kFp32        the fp32 contract of linear.hpp, as for any other operands.
//   kHopperFp8   the limited tensor-core accumulator of Hopper GPUs, emulated so that a CPU "FP8"
//                result is no better than a GPU's (docs/numerics.md: about 14 retained bits, partial
//                sums promoted to fp32 every N_C = 128 elements of K, per the DeepSeek-V3 report).
//
// The model of one output element's dot product Σ_k a[k]·b[k] under kHopperFp8, executable below:
//
//   1. K is cut into promotion intervals of kFp8PromotionInterval (128) consecutive indices,
//      counted from the start of the global range (the last may be shorter).
//   2. Within an interval, the limited accumulator L starts at +0 and takes the products in
//      groups of kFp8MmaGroup (32, one fp8 MMA step of K) in index order. Each product is exact
//      (operands are fp32 values; their product is formed in double). For a group: E is the
//      largest binary exponent among the group's products and L; L and every product are cut
//      toward zero to a multiple of 2^(E − 13) (the alignment to the largest term, 13 fraction
//      bits kept); their sum, exact, is cut toward zero to 14 significant bits (the e8m13
//      accumulator) and becomes L. A group with a non-finite product adds in plain arithmetic,
//      so NaN and inf propagate; an all-zero group leaves L unchanged.
//   3. Promotion: the interval's L, converted to fp32 (exact unless outside fp32's normal range:
//      then round-to-nearest-even), is the interval's partial. Canonical mode combines the
//      partials exactly and rounds once (the ChunkCombiner of canonical.hpp), so the result does
//      not depend on how intervals are spread over threads, ranks or micro-batches (splits must
//      fall on interval boundaries); fast mode adds them in K order in fp32, as the GPU's
//      promotion into its fp32 registers does.
//
// The operands are the dequantized fp8 values (the recipe's scales applied, fp8_recipe.hpp).
// With power-of-two scales uniform over a group — per-tensor scales, 128-blocks along K, MXFP8's
// 32-blocks — cutting relative to the largest term commutes with the scales, so the model sees
// what the tensor core sees; with fp32 scales it is the same model on the scaled values.
//
// Error (docs/numerics.md, "FP8"): a group adds at most (n_g + 1)·2^(E−13) of cutting (each term
// by less than min(2^(E−13), its magnitude)) and 2^−13·|sum| of normalization; the cuts are
// toward zero, so these errors do not cancel as rounding errors do.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/mode.hpp"
#include "src/core/host_device.hpp"

namespace lockstep {

enum class Accumulation : uint8_t { kFp32, kHopperFp8 };

inline constexpr int64_t kFp8PromotionInterval = 128;  // N_C
inline constexpr int64_t kFp8MmaGroup = 32;            // products aligned together
inline constexpr int kFp8AccumulatorFractionBits = 13; // e8m13: 14 significant bits

// x cut toward zero to a multiple of q = 2^e (inverse = 2^−e; both scalings are exact here).
LS_HOST_DEVICE inline double cut_to_quantum(double x, double inverse, double q) { return std::trunc(x * inverse) * q; }

// The limited accumulator over one promotion interval of n ≤ kFp8PromotionInterval products
// a[i·sa]·b[i·sb] (step 2 above); its value, exact in double.
LS_HOST_DEVICE inline double fp8_limited_interval(const float* a, int64_t sa, const float* b, int64_t sb,
                                                  int64_t n) {
  constexpr int F = kFp8AccumulatorFractionBits;
  double acc = 0.0;
  for (int64_t g0 = 0; g0 < n; g0 += kFp8MmaGroup) {
    const int64_t len = n - g0 < kFp8MmaGroup ? n - g0 : kFp8MmaGroup;
    double p[kFp8MmaGroup];
    double top = std::fabs(acc);
    for (int64_t i = 0; i < len; ++i) {
      p[i] = static_cast<double>(a[(g0 + i) * sa]) * static_cast<double>(b[(g0 + i) * sb]);
      top = std::fmax(top, std::fabs(p[i]));
    }
    bool finite = std::isfinite(acc);
    for (int64_t i = 0; i < len; ++i) finite = finite && std::isfinite(p[i]);
    if (!finite) {
      for (int64_t i = 0; i < len; ++i) acc += p[i];
      continue;
    }
    if (top == 0.0) continue;
    // Every cut term is a multiple of 2^(E−F) below 2^(E+1): 33 of them sum exactly in double.
    const int e = std::ilogb(top) - F;
    const double inverse = std::ldexp(1.0, -e), q = std::ldexp(1.0, e);
    double sum = cut_to_quantum(acc, inverse, q);
    for (int64_t i = 0; i < len; ++i) sum += cut_to_quantum(p[i], inverse, q);
    if (sum == 0.0) {
      acc = 0.0;
    } else {
      const int es = std::ilogb(sum) - F;
      acc = cut_to_quantum(sum, std::ldexp(1.0, -es), std::ldexp(1.0, es));
    }
  }
  return acc;
}

// Σ a[i·sa]·b[i·sb], i in [0, n), under kHopperFp8: canonical mode combines the intervals'
// partials exactly and rounds once, fast mode adds them in K order in fp32 (step 3 above).
LS_HOST_DEVICE inline float fp8_hopper_dot(Mode mode, const float* a, int64_t sa, const float* b, int64_t sb,
                                           int64_t n) {
  ChunkCombiner combined;
  float promoted = 0.0f;
  for (int64_t k0 = 0; k0 < n; k0 += kFp8PromotionInterval) {
    const int64_t len = n - k0 < kFp8PromotionInterval ? n - k0 : kFp8PromotionInterval;
    const auto partial = static_cast<float>(fp8_limited_interval(a + k0 * sa, sa, b + k0 * sb, sb, len));
    if (mode == Mode::kCanonical) {
      combined.add(partial);
    } else {
      promoted += partial;
    }
  }
  return mode == Mode::kCanonical ? combined.finish() : promoted;
}

}  // namespace lockstep
