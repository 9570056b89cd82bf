// FP8 quantization as the FP8 recipes use it (src/model/fp8_recipe.hpp): a tensor is scaled,
// narrowed to E4M3 or E5M2 and scaled back, and what the GEMM then reads is that dequantized value,
// held in fp32. A recipe's GEMM on these values runs the linear's own fp32 contract: a product of
// two fp8 values is exact in fp32, and with power-of-two scales (MXFP8, and the others when asked)
// so is the scaling, so the result is bit for bit what an fp8 GEMM with fp32 accumulation and the
// scales applied to its output computes. With fp32 scales the dequantized value carries one more
// fp32 rounding (relative 2^-24, far below fp8's 2^-4 or 2^-3).
//
// Contract (both modes; elementwise but for the block maxima, which are exact):
//   a tensor of rows × cols (row-major) is cut into blocks of block_rows × block_cols counted from
//   element (0, 0) (the last block of a row or column may be shorter); kPerTensor is one block,
//   whatever block_rows and block_cols say. Each block b has a scale s_b > 0 and its inverse:
//     kPerTensor  s = the caller's `scale` (from fp8_scale below), inv = 1 / s rounded to fp32
//     kFp32       s = fp8_max / amax_b rounded to fp32 (1 where amax_b is 0), inv = 1 / s
//     kPowerOfTwo s = 2^-X, inv = 2^X, X the least integer with amax_b ≤ fp8_max · 2^X (so no
//                 finite element saturates; X in [-127, 127] as an E8M0 scale: OCP MX's range,
//                 with TransformerEngine's rounding of the scale up rather than the OCP floor rule,
//                 which clips the largest elements of a block)
//   amax_b = the largest |x| of the block; a block holding NaN or ±inf keeps s = 1 in kFp32 and
//   kPowerOfTwo (its finite elements are not scaled by an infinite amax).
//   out[i] = widen(narrow_sat(x_i · s_b)) · inv_b, each product rounded to fp32 (RNE), the
//   narrowing src/core/formats.hpp's saturating RNE (±inf -> ±max finite, NaN stays NaN).
//
// Counts (Fp8Counts, over the whole call; exact): amax = max |x| (NaN if any x is NaN, else inf if
// any is infinite); saturated = finite elements whose |x · s| lies beyond the largest finite value
// plus half its quantum, i.e. that a non-saturating cast would overflow; underflowed = non-zero
// finite elements that became ±0; nonzero = non-zero finite elements; nonfinite = NaN and ±inf.
// And two sums over the finite elements, for the fp8 sentinel (verify/detect/fp8_sentinel.hpp):
// err_sq = Σ (out − x)², the quantization error's energy, and bound_sq = Σ e(x)², with
// e(x) = (u_fp8 + 3·u_fp32)·|x| + h_fp8·inv (h: half the smallest subnormal of the format) the most
// that quantization moves x unless it saturates — so err_sq ≤ bound_sq without saturation, and
// a saturation that costs more than the rounding of the whole tensor shows as err_sq > bound_sq.
// Both are double sums whose order follows the threads and vector lanes: not bitwise.
// out may alias inp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "src/core/formats.hpp"

namespace lockstep {

struct QuantizeShape {
  int64_t rows = 0, cols = 0;
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Scale scaling = Fp8Scale::kPerTensor;
  int64_t block_rows = 1, block_cols = 1;  // kFp32, kPowerOfTwo
  float scale = 1.0f;                      // kPerTensor
};

struct Fp8Counts {
  float amax = 0.0f;
  int64_t saturated = 0, underflowed = 0, nonzero = 0, nonfinite = 0;
  double err_sq = 0, bound_sq = 0;
};

// The per-tensor scale a recipe derives from an amax (TransformerEngine's rule): fp8_max / amax,
// divided by 2^margin, rounded down to a power of two when power_of_two (the X rule above,
// margin included); `previous` where amax is 0, NaN or infinite (nothing to scale by); the largest
// finite fp32 where the quotient overflows.
float fp8_scale(float amax, Fp8Format f, int margin, bool power_of_two, float previous);

// The larger of two amaxes, NaN before infinity before any finite value (as Fp8Counts::amax).
inline float larger_amax(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(a, b);
}

// The inverse scale (inv above) of a block of s whose amax is block_amax (kPerTensor: s's own).
float fp8_inverse_scale(const QuantizeShape& s, float block_amax);

}  // namespace lockstep

namespace lockstep::cpu {

void quantize_fp8(QuantizeShape s,
                  float* out,           // (rows, cols)
                  Fp8Counts* counts,    // this call's counts
                  const float* inp);    // (rows, cols)

// result[0] = max |inp[i]| (NaN if any is NaN, else inf if any is infinite; 0 for n = 0).
void abs_max(int64_t n, float* result, const float* inp);

}  // namespace lockstep::cpu
