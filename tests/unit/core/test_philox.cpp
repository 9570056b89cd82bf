// Tests of src/core/philox.hpp: Random123 known-answer vectors and the stochastic-rounding stream.
#include "src/core/philox.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

namespace lockstep {
namespace {

struct Kat {
  PhiloxBlock counter;
  uint32_t key0, key1;
  PhiloxBlock expected;
};

// Random123's known-answer file (kat_vectors), philox4x32 R=10: zeros, all ones, and the digits of pi.
TEST(Philox, Random123KnownAnswers) {
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const PhiloxBlock out = philox4x32_10(k.counter, k.key0, k.key1);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(out.v[i], k.expected.v[i]) << std::hex << "word " << i << " of counter "
                                           << k.counter.v[0] << " key " << k.key0;
    }
  }
}

TEST(Philox, SrBitsAreAPureFunctionOfTheirKey) {
  const uint64_t seed = 0x0123456789abcdefull;
  for (uint64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(sr_bits(seed, 7, 3, i), sr_bits(seed, 7, 3, i));
    EXPECT_EQ(sr_bits(seed, 7, 3, i), sr_block(seed, 7, 3, i / 4).v[i % 4]);
  }
  // Indices above 2^32 use the high counter word.
  const uint64_t big = (uint64_t{1} << 32) + 5;
  EXPECT_NE(sr_bits(seed, 7, 3, big), sr_bits(seed, 7, 3, 5));
  // Every field of the key changes the stream.
  std::set<uint32_t> seen;
  seen.insert(sr_bits(seed, 7, 3, 11));
  seen.insert(sr_bits(seed + 1, 7, 3, 11));
  seen.insert(sr_bits(seed + (uint64_t{1} << 32), 7, 3, 11));
  seen.insert(sr_bits(seed, 8, 3, 11));
  seen.insert(sr_bits(seed, 7, 4, 11));
  seen.insert(sr_bits(seed, 7, 3, 12));
  EXPECT_EQ(seen.size(), 6u);
}

// Each of the 32 output bits is set about half the time. Hoeffding: for N independent fair bits,
// P(|ones/N - 1/2| >= t) <= 2 exp(-2 N t^2); t is chosen so that this is delta per bit.
TEST(Philox, SrBitsAreBalancedWithinHoeffdingBound) {
  constexpr int kN = 1 << 16;
  constexpr double kDelta = 1e-9;  // false-alarm probability per bit position
  const double t = std::sqrt(std::log(2.0 / kDelta) / (2.0 * kN));
  int ones[32] = {};
  for (uint64_t i = 0; i < kN; ++i) {
    const uint32_t r = sr_bits(42, 1, 0, i);
    for (int b = 0; b < 32; ++b) ones[b] += (r >> b) & 1;
  }
  for (int b = 0; b < 32; ++b) {
    EXPECT_LE(std::fabs(ones[b] / double(kN) - 0.5), t) << "bit " << b;
  }
}

}  // namespace
}  // namespace lockstep
