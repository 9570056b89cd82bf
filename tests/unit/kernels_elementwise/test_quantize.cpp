// FP8 quantization (kernels/ops/quantize.hpp) beyond the op driver's bounds: every E4M3 and E5M2
// value survives a unit-scale quantization unchanged; the counts (saturated, underflowed, non-zero,
// non-finite, amax) are what the contract says; blocks are cut from element (0, 0) with short
// edge blocks, an all-zero block stays zero, a NaN or inf leaves its block's scale at 1 and the
// other blocks alone; the per-tensor scale rule (margin, power of two, amax 0 / NaN / inf).
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/core/formats.hpp"

namespace lockstep {
namespace {

float widen(Fp8Format f, uint8_t c) { return f == Fp8Format::kE4M3 ? e4m3_to_f32(c) : e5m2_to_f32(c); }

TEST(QuantizeFp8, EveryFp8ValueIsKeptAtUnitScale) {
  CpuBackend cpu = CpuBackend::current();
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    std::vector<float> in;
    for (int c = 0; c < 256; ++c) {
      const float v = widen(f, static_cast<uint8_t>(c));
      if (std::isfinite(v)) in.push_back(v);
    }
    std::vector<float> out(in.size());
    Fp8Counts counts;
    cpu.quantize_fp8({.rows = 1, .cols = static_cast<int64_t>(in.size()), .format = f}, out.data(), &counts, in.data());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(in[i])) << fp8_format_name(f) << " " << in[i];
    }
    EXPECT_EQ(counts.saturated, 0);
    EXPECT_EQ(counts.underflowed, 0);
    EXPECT_EQ(counts.nonfinite, 0);
    EXPECT_EQ(counts.amax, fp8_max(f));
    EXPECT_EQ(counts.nonzero, static_cast<int64_t>(in.size()) - 2);  // all but ±0
  }
}

// Every fp32 upper half with the lower halves that decide a rounding, in rows of 64 (a row holding
// NaN or inf takes the kernel's exact path, the others its vector path), at scale 1 and at a scale
// that moves the binades: each element equals formats.hpp's saturating narrowing, and the counts
// those of the narrowing.
TEST(QuantizeFp8, EqualsTheFormatsNarrowingOnEveryBinadeAndTie) {
  CpuBackend cpu = CpuBackend::current();
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) in.push_back(std::bit_cast<float>(hi << 16 | lo));
  }
  const int64_t cols = 64, rows = static_cast<int64_t>(in.size()) / cols;
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (float scale : {1.0f, 0x1.8p-3f}) {
      std::vector<float> out(in.size());
      Fp8Counts got;
      cpu.quantize_fp8({.rows = rows, .cols = cols, .format = f, .scale = scale}, out.data(), &got, in.data());
      Fp8Counts want;
      int64_t mismatches = 0;
      const float inv = 1.0f / scale;
      for (size_t i = 0; i < in.size(); ++i) {
        const float y = in[i] * scale;
        const uint8_t q = f == Fp8Format::kE4M3 ? e4m3_from_f32(y, Saturation::kSaturate) : e5m2_from_f32(y, Saturation::kSaturate);
        const uint8_t wide = f == Fp8Format::kE4M3 ? e4m3_from_f32(y, Saturation::kNonSaturating)
                                                   : e5m2_from_f32(y, Saturation::kNonSaturating);
        const float v = widen(f, q), expect = v * inv;
        if (std::isfinite(in[i])) {
          want.saturated += std::isfinite(widen(f, wide)) ? 0 : 1;
          want.nonzero += in[i] != 0.0f ? 1 : 0;
          want.underflowed += in[i] != 0.0f && v == 0.0f ? 1 : 0;
        } else {
          ++want.nonfinite;
        }
        if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(expect) && ++mismatches <= 5) {
          ADD_FAILURE() << fp8_format_name(f) << " scale " << scale << std::hex << ": input 0x"
                        << std::bit_cast<uint32_t>(in[i]) << " gave 0x" << std::bit_cast<uint32_t>(out[i])
                        << ", formats.hpp 0x" << std::bit_cast<uint32_t>(expect);
        }
      }
      EXPECT_EQ(mismatches, 0);
      EXPECT_EQ(got.saturated, want.saturated) << fp8_format_name(f);
      EXPECT_EQ(got.underflowed, want.underflowed) << fp8_format_name(f);
      EXPECT_EQ(got.nonzero, want.nonzero) << fp8_format_name(f);
      EXPECT_EQ(got.nonfinite, want.nonfinite) << fp8_format_name(f);
      EXPECT_TRUE(std::isnan(got.amax));
    }
  }
}

TEST(QuantizeFp8, CountsSaturationUnderflowAndNonFinite) {
  CpuBackend cpu = CpuBackend::current();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // E4M3, scale 2: 240·2 = 480 passes 448 + 16 (saturates), 231·2 = 462 rounds to 448 (does not),
  // 2^-11·2 = 2^-10 is half the smallest subnormal: a tie to zero (underflows); 0 is not counted.
  const std::vector<float> in = {240.0f, -231.0f, 0x1p-11f, 0.0f, 1.0f, nan, -INFINITY};
  std::vector<float> out(in.size());
  Fp8Counts c;
  cpu.quantize_fp8({.rows = 1, .cols = 7, .format = Fp8Format::kE4M3, .scale = 2.0f}, out.data(), &c, in.data());
  EXPECT_EQ(out[0], 224.0f);   // 448 / 2
  EXPECT_EQ(out[1], -224.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[4], 1.0f);
  EXPECT_TRUE(std::isnan(out[5]));
  EXPECT_EQ(out[6], -224.0f);  // -inf saturates too
  EXPECT_EQ(c.saturated, 1);
  EXPECT_EQ(c.underflowed, 1);
  EXPECT_EQ(c.nonzero, 4);
  EXPECT_EQ(c.nonfinite, 2);
  EXPECT_TRUE(std::isnan(c.amax));
  // E5M2 has IEEE rounding at the top: 57344 + 4096 ties to even, which is 65536: an overflow.
  const float top = 61440.0f;
  float q = 0;
  cpu.quantize_fp8({.rows = 1, .cols = 1, .format = Fp8Format::kE5M2}, &q, &c, &top);
  EXPECT_EQ(q, 57344.0f);
  EXPECT_EQ(c.saturated, 1);
  EXPECT_EQ(c.amax, top);
}

TEST(QuantizeFp8, PowerOfTwoBlocksFromTheCornerWithShortEdges) {
  CpuBackend cpu = CpuBackend::current();
  // 2 × 70 in 1 × 32 blocks: per row blocks [0,32), [32,64), [64,70). Row 0's first block holds
  // 500 (scale 2^-1: 500/2 = 250 -> 256 in E4M3, dequantized 512), the second is all zero, the
  // third holds a NaN; row 1 is small values whose block scale lifts them out of the subnormals.
  const int64_t rows = 2, cols = 70;
  std::vector<float> in(rows * cols, 0.0f);
  in[0] = 500.0f;
  in[1] = 1.0f;
  in[64] = std::numeric_limits<float>::quiet_NaN();
  in[65] = 0x1p-12f;
  for (int64_t j = 0; j < cols; ++j) in[cols + j] = 0x1p-20f * static_cast<float>(j + 1);
  std::vector<float> out(in.size(), -1.0f);
  Fp8Counts c;
  cpu.quantize_fp8({.rows = rows, .cols = cols, .format = Fp8Format::kE4M3, .scaling = Fp8Scale::kPowerOfTwo,
                    .block_rows = 1, .block_cols = 32},
                   out.data(), &c, in.data());
  EXPECT_EQ(out[0], 512.0f);
  EXPECT_EQ(out[1], 1.0f);
  for (int64_t j = 32; j < 64; ++j) EXPECT_EQ(out[j], 0.0f) << j;
  EXPECT_TRUE(std::isnan(out[64]));
  EXPECT_EQ(out[65], 0.0f);  // scale 1 in a NaN block: 2^-12 is below E4M3's subnormals
  EXPECT_EQ(c.saturated, 0);  // power-of-two scales never saturate a finite element
  EXPECT_EQ(c.underflowed, 1);
  // Row 1: every value kept to E4M3's 4 significant bits, none lost to the subnormals.
  for (int64_t j = 0; j < cols; ++j) {
    const float x = in[cols + j], y = out[cols + j];
    EXPECT_LE(std::fabs(y - x), std::fabs(x) * 0x1p-4f) << j;
  }
}

TEST(QuantizeFp8, Fp32BlockScalesMapEachBlockMaximumToTheFormatsMaximum) {
  CpuBackend cpu = CpuBackend::current();
  // 3 × 3 in 2 × 2 blocks: four blocks, the last a single element.
  const std::vector<float> in = {1.0f, -3.0f, 0.5f, 2.0f, 0.25f, 7.0f, 0.125f, 0.0f, -0.3f};
  std::vector<float> out(in.size());
  Fp8Counts c;
  cpu.quantize_fp8({.rows = 3, .cols = 3, .format = Fp8Format::kE5M2, .scaling = Fp8Scale::kFp32, .block_rows = 2,
                    .block_cols = 2},
                   out.data(), &c, in.data());
  // Each block's largest element is its scale's image of 57344 scaled back: itself, to fp32.
  EXPECT_NEAR(out[1], -3.0f, 3.0f * 0x1p-22f);
  EXPECT_NEAR(out[5], 7.0f, 7.0f * 0x1p-22f);
  EXPECT_NEAR(out[6], 0.125f, 0.125f * 0x1p-22f);
  EXPECT_NEAR(out[8], -0.3f, 0.3f * 0x1p-22f);
  EXPECT_EQ(c.saturated, 0);
  EXPECT_EQ(c.amax, 7.0f);
}

TEST(Fp8Scale, TransformerEnginesRule) {
  EXPECT_EQ(fp8_scale(448.0f, Fp8Format::kE4M3, 0, false, 5.0f), 1.0f);
  EXPECT_EQ(fp8_scale(448.0f, Fp8Format::kE4M3, 2, false, 5.0f), 0.25f);
  EXPECT_EQ(fp8_scale(3.0f, Fp8Format::kE4M3, 0, false, 5.0f), 448.0f / 3.0f);
  // Power of two: the largest 2^-X with 3·2^-X <= 448: 2^7 (3·128 = 384; 3·256 > 448).
  EXPECT_EQ(fp8_scale(3.0f, Fp8Format::kE4M3, 0, true, 5.0f), 128.0f);
  EXPECT_EQ(fp8_scale(3.0f, Fp8Format::kE4M3, 1, true, 5.0f), 64.0f);
  EXPECT_EQ(fp8_scale(448.0f, Fp8Format::kE4M3, 0, true, 5.0f), 1.0f);
  EXPECT_EQ(fp8_scale(449.0f, Fp8Format::kE4M3, 0, true, 5.0f), 0.5f);
  // Nothing to scale by: the previous scale stays.
  EXPECT_EQ(fp8_scale(0.0f, Fp8Format::kE5M2, 0, false, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale(INFINITY, Fp8Format::kE5M2, 0, false, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale(std::numeric_limits<float>::quiet_NaN(), Fp8Format::kE5M2, 0, false, 5.0f), 5.0f);
  // A tiny amax overflows the quotient: the largest finite scale.
  EXPECT_EQ(fp8_scale(0x1p-140f, Fp8Format::kE5M2, 0, false, 5.0f), FLT_MAX);
}

TEST(AbsMax, NanBeforeInfinityBeforeFinite) {
  CpuBackend cpu = CpuBackend::current();
  std::vector<float> x(100000, 1.0f);
  x[77777] = -3.5f;
  float m = 0;
  cpu.abs_max(static_cast<int64_t>(x.size()), &m, x.data());
  EXPECT_EQ(m, 3.5f);
  x[5] = -INFINITY;
  cpu.abs_max(static_cast<int64_t>(x.size()), &m, x.data());
  EXPECT_EQ(m, INFINITY);
  x[99999] = std::numeric_limits<float>::quiet_NaN();
  cpu.abs_max(static_cast<int64_t>(x.size()), &m, x.data());
  EXPECT_TRUE(std::isnan(m));
  cpu.abs_max(0, &m, x.data());
  EXPECT_EQ(m, 0.0f);
}

}  // namespace
}  // namespace lockstep
