// SplitMix64: a tiny counter-based 64-bit generator and its finalizer (Steele, Lea, Flood 2014),
// used wherever randomness must be identical on every machine and compiler: the sampler's
// per-epoch permutation keys, the synthetic Markov sources in datasets/, the model's initial
// parameters and the bench's synthetic tokens.
// Bounded integers and unit doubles are derived here with exact integer arithmetic, never with
// std::*_distribution (whose output is implementation-defined).
// Not cryptographic, and not the Philox stream (src/core/philox.hpp) of stochastic rounding.
#pragma once

#include <cstdint>

namespace lockstep {

// The SplitMix64 output function: a bijection on 64-bit words with full avalanche.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// The generator's output for counter x: a bijective mix of x, so draw x does not depend on which
// draws came before (counter-based use: element i of a tensor draws splitmix64(key ^ i)).
constexpr uint64_t splitmix64(uint64_t x) { return splitmix64_mix(x + kSplitMix64Gamma); }

class SplitMix64 {
 public:
  explicit constexpr SplitMix64(uint64_t seed) : state_(seed) {}

  constexpr uint64_t next() {
    state_ += kSplitMix64Gamma;
    return splitmix64_mix(state_);
  }

  // Uniform in [0, n) for n >= 1, without modulo bias: rejects draws from the incomplete top
  // block of 2^64 (at most half of the draws, on average far fewer).
  constexpr uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // a multiple of n (or 2^64 - n*k)
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

  // Uniform on the 2^53 doubles k * 2^-53, k in [0, 2^53): exact, so identical everywhere.
  constexpr double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace lockstep
