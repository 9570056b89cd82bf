// Shared by test_simd_math.cpp (8 lanes) and test_simd_math_avx512.cpp (16 lanes): each width's
// ls_expf / ls_tanhf of kernels/cpu/simd_math.hpp against the scalar functions of
// transcendental.hpp, bit for bit, over a stride through all 2^32 fp32 bit patterns (every binade,
// both signs, subnormals, ±0, ±inf and NaNs with payloads) plus the edges of their branches.
// Everything here is in an anonymous namespace: the two files are compiled for different
// instruction sets, so neither may link the other's copy.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/formats.hpp"

namespace lockstep {
namespace {

// Runs the width S's fv over `xs` S::kLanes at a time and compares every lane with f; returns the
// number of mismatches and reports the first five.
template <class S, class FV, class F>
int64_t mismatches(const char* name, const std::vector<float>& xs, FV fv, F f) {
  int64_t bad = 0;
  for (size_t i = 0; i + S::kLanes <= xs.size(); i += S::kLanes) {
    float out[S::kLanes];
    S::store(out, fv(S::load(xs.data() + i)));
    for (int l = 0; l < S::kLanes; ++l) {
      const float want = f(xs[i + l]);
      // NaN results: any NaN matches only a NaN; every other value bit for bit
      const bool same = std::isnan(want) ? std::isnan(out[l]) : f32_bits(out[l]) == f32_bits(want);
      if (!same && ++bad <= 5) {
        ADD_FAILURE() << name << "(" << std::hexfloat << xs[i + l] << " = 0x" << std::hex << f32_bits(xs[i + l])
                      << ") = " << std::hexfloat << out[l] << ", scalar " << want;
      }
    }
  }
  return bad;
}

std::vector<float> inputs() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) xs.push_back(f32_from_bits(static_cast<uint32_t>(b)));
  // Branch edges: exp's clamps and tanh's 0.9 switch, with their neighbours.
  for (float e : {88.8f, -104.0f, 0.9f, -0.9f, 44.4f, 88.72284f, -87.33655f, -103.27893f}) {
    for (int d = -4; d <= 4; ++d) xs.push_back(f32_from_bits(f32_bits(e) + static_cast<uint32_t>(d)));
  }
  for (float s : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f}) xs.push_back(s);
  while (xs.size() % 16 != 0) xs.push_back(1.0f);
  return xs;
}

}  // namespace
}  // namespace lockstep
