// Kernel output against references: within the bound a reference<Bounded<double>> carries
// (verify::compare_within), or bit for bit (verify::compare_exact). Both print the report, with
// the tightness (observed error / bound) for bounded checks, and record the tightness as a test
// property so that it lands in the XML output.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "reference/bounded.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::test {

using Bd = reference::Bounded<double>;

// fp32 inputs convert exactly: error 0.
inline std::vector<Bd> to_bounded(const std::vector<float>& x) { return std::vector<Bd>(x.begin(), x.end()); }

// got[i] within want[i].err of want[i].value for every i.
inline void expect_within(const std::string& what, const float* got, const Bd* want, int64_t n) {
  std::vector<double> value(static_cast<size_t>(n)), bound(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    value[i] = want[i].value;
    bound[i] = want[i].err;
  }
  const verify::CompareReport r = verify::compare_within(got, value.data(), bound.data(), n);
  std::cout << r.summary(what) << "\n";
  ::testing::Test::RecordProperty(what + " max tightness", std::to_string(r.max_tightness));
  EXPECT_TRUE(r.ok()) << r.summary(what);
}

inline void expect_within(const std::string& what, const std::vector<float>& got, const std::vector<Bd>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_within(what, got.data(), want.data(), static_cast<int64_t>(got.size()));
}

inline void expect_bitwise(const std::string& what, const std::vector<float>& got,
                           const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const verify::CompareReport r = verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_TRUE(r.ok()) << r.summary(what);
}

}  // namespace lockstep::test
