// The 8-lane ls_expf / ls_tanhf of kernels/cpu/simd_math.hpp against the scalar functions of
// transcendental.hpp, bit for bit, over a stride through all 2^32 fp32 bit patterns (every binade,
// both signs, subnormals, ±0, ±inf and NaNs with payloads) plus the edges of their branches.
// The kernels are built with -mavx2 -mfma (their floor, kernels/cpu/isa.hpp); this file is built
// with the test flags, so it asks for the same instruction set here.
#pragma GCC target("avx2,fma")

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/transcendental.hpp"

namespace lockstep {
namespace {

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Runs f8 over `xs` 8 at a time and compares every lane with f; returns the number of mismatches
// and reports the first five.
template <class F8, class F>
int64_t mismatches(const char* name, const std::vector<float>& xs, F8 f8, F f) {
  int64_t bad = 0;
  for (size_t i = 0; i + 8 <= xs.size(); i += 8) {
    float out[8];
    _mm256_storeu_ps(out, f8(_mm256_loadu_ps(xs.data() + i)));
    for (int l = 0; l < 8; ++l) {
      const float want = f(xs[i + l]);
      // NaN results: any NaN matches only a NaN; every other value bit for bit
      const bool same = std::isnan(want) ? std::isnan(out[l]) : bits(out[l]) == bits(want);
      if (!same && ++bad <= 5) {
        ADD_FAILURE() << name << "(" << std::hexfloat << xs[i + l] << " = 0x" << std::hex << bits(xs[i + l])
                      << ") = " << std::hexfloat << out[l] << ", scalar " << want;
      }
    }
  }
  return bad;
}

std::vector<float> inputs() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) xs.push_back(from_bits(static_cast<uint32_t>(b)));
  // Branch edges: exp's clamps and tanh's 0.9 switch, with their neighbours.
  for (float e : {88.8f, -104.0f, 0.9f, -0.9f, 44.4f, 88.72284f, -87.33655f, -103.27893f}) {
    for (int d = -4; d <= 4; ++d) xs.push_back(from_bits(bits(e) + static_cast<uint32_t>(d)));
  }
  for (float s : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f}) xs.push_back(s);
  while (xs.size() % 8 != 0) xs.push_back(1.0f);
  return xs;
}

TEST(SimdMath, ExpfMatchesScalarBitwise) {
  EXPECT_EQ(mismatches("expf8", inputs(), cpu::simd::expf8, ls_expf), 0);
}

TEST(SimdMath, TanhfMatchesScalarBitwise) {
  EXPECT_EQ(mismatches("tanhf8", inputs(), cpu::simd::tanhf8, ls_tanhf), 0);
}

}  // namespace
}  // namespace lockstep
