// FP8 quantization (kernels/ops/quantize.hpp's contract) and the per-tensor scale rule, written
// again from the contract over the reference's scalar types:
//   CanonicalF32   the quantized value itself: the block scales found by search in double, the
//                  products rounded once to fp32 (a product of two floats is exact in double, so
//                  its rounding to float is the fp32 product's), the narrowing formats.hpp's;
//   Bounded<T>     the input's value kept, its bound grown by what the quantization may move it:
//                  (|x| + E)·(u_fp8 + 3·u_fp32)(1 + u_fp32)² + h_fp8·inv (h: half the smallest fp8
//                  subnormal, inv the block's inverse scale) — an error up to |x| + E where the
//                  scaled value may reach the saturation threshold; ±inf quantize to ±fp8_max·inv;
//   anything else  (double, Mpfr: the exact model) unchanged.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/bounded.hpp"
#include "reference/canonical_f32.hpp"
#include "reference/reduce.hpp"
#include "src/core/formats.hpp"

namespace lockstep::reference {

struct Fp8Quantization {
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Scale scaling = Fp8Scale::kPerTensor;
  int64_t block_rows = 1, block_cols = 1;
  float scale = 1.0f;  // kPerTensor
};

struct Fp8BlockScale {
  double scale = 1, inv = 1;
};

// A block's scale from its amax (a non-negative double of float value, or NaN/inf).
inline Fp8BlockScale fp8_block_scale(const Fp8Quantization& q, double amax) {
  const auto to_f32 = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  if (q.scaling == Fp8Scale::kPerTensor) return {q.scale, to_f32(1.0 / q.scale)};
  if (!(amax > 0) || !std::isfinite(amax)) return {1, 1};
  const double top = fp8_max(q.format);
  if (q.scaling == Fp8Scale::kFp32) {
    const double s = to_f32(top / amax);
    if (!std::isfinite(s)) return {FLT_MAX, to_f32(1.0 / FLT_MAX)};
    return {s, to_f32(1.0 / s)};
  }
  int X = -127;  // the least X in [-127, 127] with amax <= top · 2^X
  while (X < 127 && amax > std::ldexp(top, X)) ++X;
  return {std::ldexp(1.0, -X), std::ldexp(1.0, X)};
}

// A per-tensor scale from an amax, kernels/ops/quantize.hpp's fp8_scale written again: fp8_max /
// amax rounded to fp32, divided by 2^margin; or 2^-(X + margin), X the least with amax ≤
// fp8_max·2^X; `previous` for an amax of 0, NaN or inf; the largest float where the quotient
// overflows.
inline float fp8_tensor_scale(double amax, Fp8Format f, int margin, bool power_of_two, float previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double top = fp8_max(f);
  if (power_of_two) {
    int X = -127;
    while (X < 127 && amax > std::ldexp(top, X)) ++X;
    return static_cast<float>(std::ldexp(1.0, -std::clamp(X + margin, -127, 127)));
  }
  const float q = std::ldexp(static_cast<float>(top / amax), -margin);
  return std::isfinite(q) ? q : FLT_MAX;
}

template <class Real>
Real fp8_quantized(const Real& x, const Fp8Quantization&, const Fp8BlockScale&) {
  return x;
}

inline CanonicalF32 fp8_quantized(const CanonicalF32& x, const Fp8Quantization& q, const Fp8BlockScale& b) {
  const float y = static_cast<float>(static_cast<double>(x.v) * b.scale);
  const float v = q.format == Fp8Format::kE4M3 ? e4m3_to_f32(e4m3_from_f32(y, Saturation::kSaturate))
                                               : e5m2_to_f32(e5m2_from_f32(y, Saturation::kSaturate));
  return static_cast<float>(static_cast<double>(v) * b.inv);
}

template <class T>
Bounded<T> fp8_quantized(const Bounded<T>& x, const Fp8Quantization& q, const Fp8BlockScale& b) {
  using std::abs;
  const FormatInfo& f = fp8_info(q.format);
  const T u32 = T(0x1p-24);
  if (std::isnan(static_cast<double>(x.value))) return x;
  if (std::isinf(static_cast<double>(x.value))) {
    const T v = T(x.value > 0 ? 1 : -1) * T(f.max_finite) * T(b.inv);
    return {v, abs(v) * u32};
  }
  const T reach = abs(x.value) + x.err;
  // The smallest scaled magnitude that narrowing takes past the largest finite value.
  const T threshold = T(f.max_finite + std::ldexp(1.0, std::ilogb(f.max_finite) - f.man_bits - 1));
  if (!(reach * T(b.scale) * (T(1) + u32) < threshold)) return {x.value, x.err + reach * (T(1) + T(4) * u32)};
  const T rel = (T(f.unit_roundoff) + T(3) * u32) * (T(1) + u32) * (T(1) + u32);
  return {x.value, x.err + rel * reach + T(f.min_subnormal / 2) * T(b.inv) * (T(1) + T(2) * u32)};
}

// out (rows, cols) = inp quantized as kernels/ops/quantize.hpp says, block by block.
template <class Real>
void quantize_fp8(int64_t rows, int64_t cols, const Fp8Quantization& q, Real* out, const Real* inp) {
  const bool whole = q.scaling == Fp8Scale::kPerTensor;
  const int64_t br = whole ? rows : q.block_rows, bc = whole ? cols : q.block_cols;
  for (int64_t r0 = 0; r0 < rows; r0 += br) {
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(r0 + br, rows), c1 = std::min(c0 + bc, cols);
      double amax = 0;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const double a = std::fabs(value_of(inp[r * cols + c]));
          amax = std::isnan(a) || std::isnan(amax) ? NAN : std::max(amax, a);
        }
      }
      const Fp8BlockScale b = fp8_block_scale(q, amax);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = fp8_quantized(inp[r * cols + c], q, b);
      }
    }
  }
}

}  // namespace lockstep::reference
