// Shared helpers of the attention / RoPE / cross-entropy kernel tests: random inputs, Bounded
// conversions, the within-bound check with its tightness printed, and the bitwise check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "reference/bounded.hpp"
#include "src/core/check.hpp"
#include "verify/compare.hpp"

namespace lockstep::test {

using B64 = reference::Bounded<double>;

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<B64> to_bounded(const std::vector<float>& x) {
  return std::vector<B64>(x.begin(), x.end());
}

// Kernel output within the Bounded reference's bound, elementwise; prints the tightness.
inline void expect_within(const std::string& what, const std::vector<float>& got,
                          const std::vector<B64>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<double> value(want.size()), bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    value[i] = want[i].value;
    bound[i] = want[i].err;
  }
  const auto r = verify::compare_within(got.data(), value.data(), bound.data(),
                                        static_cast<int64_t>(got.size()));
  std::cout << "  " << what << ": max tightness (err/bound) " << r.max_tightness << ", max ulp "
            << r.max_ulp << "\n";
  EXPECT_TRUE(r.ok()) << r.summary(what);
}

inline void expect_bitwise(const std::string& what, const std::vector<float>& got,
                           const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto r = verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_TRUE(r.ok()) << r.summary(what);
}

}  // namespace lockstep::test
