// Shared helpers of the elementwise-kernel tests: random inputs, Bounded<double> conversions,
// within-bound and bitwise checks that print their tightness, and thread-count sweeps.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops/mode.hpp"
#include "reference/bounded.hpp"
#include "reference/reduce.hpp"
#include "verify/compare.hpp"

namespace lockstep::test {

using Bd = reference::Bounded<double>;

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<Bd> to_bounded(const std::vector<float>& x) {
  return std::vector<Bd>(x.begin(), x.end());  // fp32 inputs are exact: error 0
}

// got within the Bounded reference's bound, elementwise; prints the report (with tightness).
inline void expect_within(const std::string& what, const float* got, const Bd* want, int64_t n) {
  std::vector<double> w(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w[i] = want[i].value;
    b[i] = want[i].err;
  }
  const verify::CompareReport r = verify::compare_within(got, w.data(), b.data(), n);
  std::cout << r.summary(what) << "\n";
  EXPECT_TRUE(r.ok()) << r.summary(what);
}
inline void expect_within(const std::string& what, const std::vector<float>& got,
                          const std::vector<Bd>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_within(what, got.data(), want.data(), static_cast<int64_t>(got.size()));
}

inline void expect_bitwise(const std::string& what, const std::vector<float>& got,
                           const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const verify::CompareReport r =
      verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_TRUE(r.ok()) << r.summary(what);
}

// Runs `f` (returning every output of a kernel call, concatenated) with 1, 2 and 3 OpenMP
// threads and requires identical bits; returns the single-thread result.
template <class F>
std::vector<float> expect_thread_invariant(const std::string& what, F f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = f();
  for (int t : {2, 3}) {
    omp_set_num_threads(t);
    expect_bitwise(what + " with " + std::to_string(t) + " threads vs 1", f(), one);
  }
  omp_set_num_threads(saved);
  return one;
}

// A gradient sink for `mode` over n elements, and its rounded contents.
struct Sink {
  Mode mode;
  std::vector<float> f32;
  ExactAccumulator exact;
  Sink(Mode m, int64_t n) : mode(m), f32(static_cast<size_t>(n), 0.0f), exact(static_cast<size_t>(n)) {}
  GradSink sink() { return mode == Mode::kCanonical ? GradSink{nullptr, &exact, 0} : GradSink{f32.data(), nullptr, 0}; }
  std::vector<float> values() const {
    if (mode == Mode::kFast) return f32;
    std::vector<float> out(exact.size());
    exact.round_to(out.data());
    return out;
  }
};

inline std::vector<float> concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> all;
  for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

inline constexpr Mode kModes[] = {Mode::kCanonical, Mode::kFast};

}  // namespace lockstep::test
