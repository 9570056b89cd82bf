// FP8 quantization on the CPU (contract in kernels/ops/quantize.hpp). The tensor is walked in
// bands of block_rows rows (one row for per-tensor scaling): a band's column maxima give each
// block's amax and so a scale per column, then every row of the band is quantized against those
// per-column scales — loops over contiguous columns that the compiler vectorises. The rounding
// works on values, not codes: a finite |x·s| at or above the format's smallest normal keeps its
// top 1 + man bits by the carry trick on its fp32 bits (add half an ulp of the kept precision minus
// one plus the lowest kept bit, drop the rest: round to nearest even, a carry running into the
// exponent); below it, adding and subtracting 2^(emin − man + 23) rounds to the subnormal quantum
// in the FPU's own round-to-nearest-even; beyond the largest finite value it saturates. Bands
// holding NaN or ±inf are quantized again element by element through src/core/formats.hpp's
// narrowing, whose NaN and infinity rules the contract names; the vector path equals that
// narrowing on every finite input (tests/unit/kernels_elementwise/test_quantize.cpp sweeps them).
// Bands go to the threads; the counts are integer sums and maxima, exact in any order.
#include "kernels/ops/quantize.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace lockstep {

namespace {


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

// The rounding of one format, on values.
struct Rounding {
  uint32_t half_minus_one, drop_mask;  // the carry trick at 1 + man bits
  int drop;                            // 23 − man
  float min_normal, subnormal_magic, max;
  float error_unit, half_subnormal;  // e(x) = error_unit·|x| + half_subnormal·inv

  explicit Rounding(Fp8Format f) {
    const FormatInfo& info = fp8_info(f);
    drop = 23 - info.man_bits;
    half_minus_one = (1u << (drop - 1)) - 1;
    drop_mask = ~((1u << drop) - 1);
    min_normal = static_cast<float>(info.min_normal);
    subnormal_magic = std::ldexp(1.0f, std::ilogb(info.min_normal) - info.man_bits + 23);
    max = static_cast<float>(info.max_finite);
    error_unit = static_cast<float>(info.unit_roundoff + 3 * 0x1p-24);
    half_subnormal = static_cast<float>(info.min_subnormal / 2);
  }
};

// Counts of a band, kept as plain integers so that the loops vectorise.
struct BandCounts {
  int64_t saturated = 0, underflowed = 0, nonzero = 0, nonfinite = 0;
  double err_sq = 0, bound_sq = 0;
};

// One row against its scales — per column, or one for the row (kUniform: scale[0], inv[0]) —
// the vector path. No branches: both roundings of every element are computed and one selected, on
// the magnitude's bits (which order like its value); kernels/CMakeLists.txt lets the compiler
// evaluate the unused one. A NaN or ±inf input is counted in `nonfinite`, its output not final:
// the caller quantizes such a row again element by element. row_max: the largest |x| (finite rows).
template <bool kUniform>
void quantize_row(const Rounding& R, int64_t n, float* __restrict out, const float* __restrict in,
                  const float* __restrict scale, const float* __restrict inv, BandCounts& c, float& row_max,
                  int64_t& nonfinite) {
  const uint32_t half = R.half_minus_one, mask = R.drop_mask;
  const int drop = R.drop;
  const uint32_t min_normal = std::bit_cast<uint32_t>(R.min_normal), top = std::bit_cast<uint32_t>(R.max);
  const float magic = R.subnormal_magic, error_unit = R.error_unit, half_subnormal = R.half_subnormal;
  int32_t saturated = 0, underflowed = 0, nonzero = 0, special = 0;
  float largest = 0.0f;
  // A row's energies in fp32 (a statistic: its relative error stays near n·2^-24), its total in double.
  float err_sq = 0, bound_sq = 0;
#pragma omp simd reduction(+ : saturated, underflowed, nonzero, special, err_sq, bound_sq) reduction(max : largest)
  for (int64_t j = 0; j < n; ++j) {
    const float s_j = kUniform ? scale[0] : scale[j];
    const float inv_j = kUniform ? inv[0] : inv[j];
    const uint32_t xb = std::bit_cast<uint32_t>(in[j]) & 0x7fffffffu;
    special += xb >= 0x7f800000u ? 1 : 0;
    largest = std::max(largest, std::bit_cast<float>(xb < 0x7f800000u ? xb : 0u));
    const float y = in[j] * s_j;
    const uint32_t yb = std::bit_cast<uint32_t>(y);
    const uint32_t b = yb & 0x7fffffffu;
    const uint32_t normal = (b + half + ((b >> drop) & 1u)) & mask;
    const uint32_t subnormal = std::bit_cast<uint32_t>((std::bit_cast<float>(b) + magic) - magic);
    const uint32_t rounded = b < min_normal ? subnormal : normal;
    const int32_t over = rounded > top ? 1 : 0;
    const uint32_t r = over != 0 ? top : rounded;
    const float q = std::bit_cast<float>(r | (yb & 0x80000000u)) * inv_j;
    out[j] = q;
    const float d = q - in[j];
    const float e = error_unit * std::bit_cast<float>(xb) + half_subnormal * inv_j;
    err_sq += d * d;
    bound_sq += e * e;
    const int32_t nz = xb != 0 ? 1 : 0;
    saturated += over;
    nonzero += nz;
    underflowed += nz & (r == 0 ? 1 : 0);
  }
  nonfinite += special;
  if (special > 0) return;
  row_max = std::max(row_max, largest);
  c.saturated += saturated;
  c.underflowed += underflowed;
  c.nonzero += nonzero;
  c.err_sq += err_sq;
  c.bound_sq += bound_sq;
}

// One element through formats.hpp's narrowing: the path for bands with NaN or ±inf.
float quantize_exact(const Rounding& R, Fp8Format f, float x, float scale, float inv, BandCounts& c) {
  const float y = x * scale;
  const bool e4m3 = f == Fp8Format::kE4M3;
  if (!std::isfinite(x)) {
    ++c.nonfinite;
  } else {
    const uint8_t wide = e4m3 ? e4m3_from_f32(y, Saturation::kNonSaturating) : e5m2_from_f32(y, Saturation::kNonSaturating);
    if (!std::isfinite(e4m3 ? e4m3_to_f32(wide) : e5m2_to_f32(wide))) ++c.saturated;
  }
  const uint8_t code = e4m3 ? e4m3_from_f32(y, Saturation::kSaturate) : e5m2_from_f32(y, Saturation::kSaturate);
  const float v = e4m3 ? e4m3_to_f32(code) : e5m2_to_f32(code);
  const float out = v * inv;
  if (std::isfinite(x)) {
    const double d = static_cast<double>(out) - static_cast<double>(x);
    const double e = static_cast<double>(R.error_unit * std::fabs(x) + R.half_subnormal * inv);
    c.err_sq += d * d;
    c.bound_sq += e * e;
    if (x != 0.0f) {
      ++c.nonzero;
      if (v == 0.0f) ++c.underflowed;
    }
  }
  return out;
}

}  // namespace

float fp8_inverse_scale(const QuantizeShape& s, float block_amax) { return block_scale(s, block_amax).inv; }

float fp8_scale(float amax, Fp8Format f, int margin, bool power_of_two, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  if (power_of_two) return std::ldexp(1.0f, -std::clamp(power_of_two_exponent(amax, f) + margin, -127, 127));
  const float scale = std::ldexp(fp8_max(f) / amax, -margin);
  return std::isfinite(scale) ? scale : std::numeric_limits<float>::max();
}

}  // namespace lockstep

namespace lockstep::cpu {

void quantize_fp8(QuantizeShape s, float* out, Fp8Counts* counts, const float* inp) {
  Fp8Counts total;
  if (s.rows > 0 && s.cols > 0) {
    const bool whole = s.scaling == Fp8Scale::kPerTensor;
    const int64_t br = whole ? 1 : std::max<int64_t>(s.block_rows, 1);
    const int64_t bc = whole ? s.cols : std::max<int64_t>(s.block_cols, 1);
    const int64_t bands = (s.rows + br - 1) / br, C = s.cols;
    const Rounding R(s.format);
    float amax = 0.0f;
    int64_t saturated = 0, underflowed = 0, nonzero = 0, nonfinite = 0;
    double err_sq = 0, bound_sq = 0;
#pragma omp parallel reduction(max : amax) reduction(+ : saturated, underflowed, nonzero, nonfinite, err_sq, bound_sq) if (s.rows * s.cols > (int64_t{1} << 15))
    {
      std::vector<float> col_amax(static_cast<size_t>(C)), scale(static_cast<size_t>(C)), inv(scale.size());
      // A band's counts into this thread's share of the reductions.
      const auto add = [&](const BandCounts& c, float band_amax) {
        amax = std::max(amax, band_amax);  // NaN does not survive a max: it travels as a count (below)
        saturated += c.saturated;
        underflowed += c.underflowed;
        nonzero += c.nonzero;
        nonfinite += c.nonfinite;
        err_sq += c.err_sq;
        bound_sq += c.bound_sq;
      };
      if (whole) {
        const BlockScale b = block_scale(s, 0.0f);
        std::fill(scale.begin(), scale.end(), b.scale);
        std::fill(inv.begin(), inv.end(), b.inv);
      }
#pragma omp for schedule(static)
      for (int64_t band = 0; band < bands; ++band) {
        const int64_t r0 = band * br, r1 = std::min(r0 + br, s.rows);
        // The band's maximum and, for block scales, its column maxima; NaN or inf anywhere sends
        // the band down the exact path.
        float band_amax = 0.0f;
        int64_t nans = 0;
        if (whole && out != inp) {
          // One pass: a row met NaN or inf is quantized again element by element.
          BandCounts c;
          int64_t special = 0;
          quantize_row<true>(R, C, out + r0 * C, inp + r0 * C, scale.data(), inv.data(), c, band_amax, special);
          if (special > 0) {
            c = {};
            for (int64_t j = 0; j < C; ++j) {
              out[r0 * C + j] = quantize_exact(R, s.format, inp[r0 * C + j], scale[0], inv[0], c);
            }
          }
          add(c, band_amax);
          continue;
        }
        if (!whole) std::fill(col_amax.begin(), col_amax.end(), 0.0f);
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = inp + r * C;
          float row_max = 0.0f;
          if (whole) {
#pragma omp simd reduction(max : row_max) reduction(+ : nans)
            for (int64_t j = 0; j < C; ++j) {
              const float a = std::fabs(row[j]);
              nans += a != a ? 1 : 0;
              row_max = std::max(row_max, a);
            }
          } else {
            float* cm = col_amax.data();
#pragma omp simd reduction(max : row_max) reduction(+ : nans)
            for (int64_t j = 0; j < C; ++j) {
              const float a = std::fabs(row[j]);
              nans += a != a ? 1 : 0;
              row_max = std::max(row_max, a);
              cm[j] = std::max(cm[j], a);
            }
          }
          band_amax = std::max(band_amax, row_max);
        }
        const bool nonfinite_band = nans > 0 || band_amax > std::numeric_limits<float>::max();
        if (!whole) {
          for (int64_t c0 = 0; c0 < C; c0 += bc) {
            const int64_t c1 = std::min(c0 + bc, C);
            float block_amax = 0.0f;
            for (int64_t j = c0; j < c1; ++j) block_amax = larger_amax(block_amax, col_amax[static_cast<size_t>(j)]);
            if (nonfinite_band) {  // the exact maximum, NaN first
              block_amax = 0.0f;
              for (int64_t r = r0; r < r1; ++r) {
                for (int64_t j = c0; j < c1; ++j) block_amax = larger_amax(block_amax, std::fabs(inp[r * C + j]));
              }
            }
            const BlockScale b = block_scale(s, block_amax);
            std::fill(scale.begin() + c0, scale.begin() + c1, b.scale);
            std::fill(inv.begin() + c0, inv.begin() + c1, b.inv);
          }
        }
        BandCounts c;
        for (int64_t r = r0; r < r1; ++r) {
          if (nonfinite_band) {
            for (int64_t j = 0; j < C; ++j) {
              out[r * C + j] = quantize_exact(R, s.format, inp[r * C + j], scale[static_cast<size_t>(j)],
                                              inv[static_cast<size_t>(j)], c);
            }
          } else {
            float unused = 0.0f;
            int64_t special = 0;
            quantize_row<false>(R, C, out + r * C, inp + r * C, scale.data(), inv.data(), c, unused, special);
          }
        }
        add(c, band_amax);
      }
    }
    total = {amax, saturated, underflowed, nonzero, nonfinite, err_sq, bound_sq};
    if (nonfinite > 0) {  // NaN first, then infinity: from the data, as the contract orders them
      for (int64_t i = 0; i < s.rows * s.cols; ++i) total.amax = larger_amax(total.amax, std::fabs(inp[i]));
    }
  }
  if (counts != nullptr) *counts = total;
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
