// Helpers of the elementwise-kernel tests: thread-count sweeps, gradient sinks for both modes, and
// the shared test helpers they build on (random inputs, Bounded<double> conversions, within-bound
// and bitwise checks; tests/support/).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/mode.hpp"
#include "reference/reduce.hpp"
#include "tests/support/bounded_compare.hpp"
#include "tests/support/random_values.hpp"

namespace lockstep::test {

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
