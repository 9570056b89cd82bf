// FP8 quantization on the CPU (contract in kernels/ops/quantize.hpp): src/core/formats.hpp's
// narrowing per element, blocks over the threads; the counts are exact (integer sums, maxima).
#include "kernels/ops/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/core/formats.hpp"

namespace lockstep {

namespace {

// The larger amax, NaN before infinity before any finite value.
float worse_amax(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(a, b);
}

// X: the least integer with amax ≤ fp8_max · 2^X, for amax > 0 finite, clamped to E8M0's range.
// Exact: with amax = m·2^e and fp8_max = mm·2^ee (frexp: m, mm in [0.5, 1)), amax ≤ fp8_max·2^X
// holds for X ≥ e − ee when m ≤ mm, else from e − ee + 1.
int power_of_two_exponent(float amax, Fp8Format f) {
  int e = 0, ee = 0;
  const float m = std::frexp(amax, &e);
  const float mm = std::frexp(fp8_max(f), &ee);
  return std::clamp(e - ee + (m > mm ? 1 : 0), -127, 127);
}

struct BlockScale {
  float scale, inv;
};

BlockScale block_scale(const QuantizeShape& s, float amax) {
  if (s.scaling == Fp8Scale::kPerTensor) return {s.scale, 1.0f / s.scale};
  if (!(amax > 0.0f) || !std::isfinite(amax)) return {1.0f, 1.0f};
  if (s.scaling == Fp8Scale::kFp32) {
    const float scale = fp8_max(s.format) / amax;
    if (!std::isfinite(scale)) return {std::numeric_limits<float>::max(), 1.0f / std::numeric_limits<float>::max()};
    return {scale, 1.0f / scale};
  }
  const int X = power_of_two_exponent(amax, s.format);
  return {std::ldexp(1.0f, -X), std::ldexp(1.0f, X)};
}

// One element: the dequantized value, its counts.
template <Fp8Format F>
float quantize_one(float x, BlockScale b, Fp8Counts& c) {
  if (!std::isfinite(x)) {
    ++c.nonfinite;
    c.amax = worse_amax(c.amax, std::fabs(x));
    const float y = x * b.scale;
    const uint8_t q = F == Fp8Format::kE4M3 ? e4m3_from_f32(y, Saturation::kSaturate)
                                            : e5m2_from_f32(y, Saturation::kSaturate);
    return (F == Fp8Format::kE4M3 ? e4m3_to_f32(q) : e5m2_to_f32(q)) * b.inv;
  }
  const float ax = std::fabs(x);
  c.amax = std::max(c.amax, ax);
  const float y = x * b.scale;
  // Non-saturating first, to see an overflow; then the saturated value in its place.
  uint8_t q = F == Fp8Format::kE4M3 ? e4m3_from_f32(y, Saturation::kNonSaturating)
                                    : e5m2_from_f32(y, Saturation::kNonSaturating);
  float v = F == Fp8Format::kE4M3 ? e4m3_to_f32(q) : e5m2_to_f32(q);
  if (!std::isfinite(v)) {
    ++c.saturated;
    q = F == Fp8Format::kE4M3 ? e4m3_from_f32(y, Saturation::kSaturate) : e5m2_from_f32(y, Saturation::kSaturate);
    v = F == Fp8Format::kE4M3 ? e4m3_to_f32(q) : e5m2_to_f32(q);
  }
  if (x != 0.0f) {
    ++c.nonzero;
    if (v == 0.0f) ++c.underflowed;
  }
  return v * b.inv;
}

template <Fp8Format F>
void quantize_blocks(const QuantizeShape& s, float* out, Fp8Counts& total, const float* inp) {
  const bool whole = s.scaling == Fp8Scale::kPerTensor;
  const int64_t br = whole ? std::max<int64_t>(s.rows, 1) : s.block_rows;
  const int64_t bc = whole ? std::max<int64_t>(s.cols, 1) : s.block_cols;
  const int64_t nbr = (s.rows + br - 1) / br, nbc = (s.cols + bc - 1) / bc;
  float amax = 0.0f;
  int64_t saturated = 0, underflowed = 0, nonzero = 0, nonfinite = 0;
  bool nan = false;
  // Per-tensor work is split by rows; a block's amax comes before its elements.
  const int64_t units = whole ? s.rows : nbr * nbc;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(+ : saturated, underflowed, nonzero, nonfinite) reduction(|| : nan) if (s.rows * s.cols > (int64_t{1} << 15))
  for (int64_t u = 0; u < units; ++u) {
    const int64_t r0 = whole ? u : (u / nbc) * br, c0 = whole ? 0 : (u % nbc) * bc;
    const int64_t r1 = whole ? u + 1 : std::min(r0 + br, s.rows), c1 = whole ? s.cols : std::min(c0 + bc, s.cols);
    float block_amax = 0.0f;
    if (!whole) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) block_amax = worse_amax(block_amax, std::fabs(inp[r * s.cols + c]));
      }
    }
    const BlockScale b = block_scale(s, block_amax);
    Fp8Counts c;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t col = c0; col < c1; ++col) out[r * s.cols + col] = quantize_one<F>(inp[r * s.cols + col], b, c);
    }
    if (std::isnan(c.amax)) nan = true;
    else amax = std::max(amax, c.amax);
    saturated += c.saturated;
    underflowed += c.underflowed;
    nonzero += c.nonzero;
    nonfinite += c.nonfinite;
  }
  total = {nan ? std::numeric_limits<float>::quiet_NaN() : amax, saturated, underflowed, nonzero, nonfinite};
}

}  // namespace

void Fp8Counts::add(const Fp8Counts& o) {
  amax = worse_amax(amax, o.amax);
  saturated += o.saturated;
  underflowed += o.underflowed;
  nonzero += o.nonzero;
  nonfinite += o.nonfinite;
}

float fp8_scale(float amax, Fp8Format f, int margin, bool power_of_two, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  if (power_of_two) return std::ldexp(1.0f, -std::clamp(power_of_two_exponent(amax, f) + margin, -127, 127));
  const float scale = std::ldexp(fp8_max(f) / amax, -margin);
  return std::isfinite(scale) ? scale : std::numeric_limits<float>::max();
}

}  // namespace lockstep

namespace lockstep::cpu {

void quantize_fp8(QuantizeShape s, float* out, Fp8Counts* counts, const float* inp) {
  Fp8Counts c;
  if (s.rows > 0 && s.cols > 0) {
    if (s.format == Fp8Format::kE4M3) {
      quantize_blocks<Fp8Format::kE4M3>(s, out, c, inp);
    } else {
      quantize_blocks<Fp8Format::kE5M2>(s, out, c, inp);
    }
  }
  if (counts != nullptr) *counts = c;
}

void abs_max(int64_t n, float* result, const float* inp) {
  float m = 0.0f;
  bool nan = false;
#pragma omp parallel for simd schedule(static) reduction(max : m) reduction(|| : nan) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(inp[i]);
    nan = nan || a != a;
    m = std::max(m, a);
  }
  *result = nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

}  // namespace lockstep::cpu
