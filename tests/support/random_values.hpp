// Random test inputs for the kernel tests: uniform floats from a seed, normal values spread over
// binades, and special values (±0, subnormals, overflowing magnitudes, ±inf, NaN) that stress
// rounding and propagation. Every generator is seeded by the caller: failures replay exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace lockstep::test {

// n floats uniform in [lo, hi) from std::mt19937(seed).
inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Normal values times a random power of two in [2^-e, 2^e]: a spread of magnitudes that keeps the
// chunk partials' exact sum within a double most of the time.
inline float random_value(std::mt19937_64& g, int spread = 4) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> e(-spread, spread);
  return std::ldexp(normal(g), e(g));
}

// Values that stress the canonical path: ±0, subnormals, huge values whose products overflow in a
// chunk, inf, NaN, and magnitudes 2^±100 apart so that the double combination becomes inexact.
inline float special_value(std::mt19937_64& g) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::uniform_int_distribution<int> pick(0, 11);
  switch (pick(g)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return std::ldexp(random_value(g), -135);  // subnormal
    case 3: return std::numeric_limits<float>::denorm_min();
    case 4: return std::ldexp(random_value(g), 100);   // products overflow fp32
    case 5: return std::ldexp(random_value(g), -100);  // far below the others
    case 6: return kInf;
    case 7: return -kInf;
    case 8: return std::numeric_limits<float>::quiet_NaN();
    case 9: return std::numeric_limits<float>::max();
    default: return random_value(g);
  }
}

}  // namespace lockstep::test
