// The CPU's rounding to bf16 (kernels/ops/cast.hpp) equals src/core/formats.hpp's bf16_from_f32
// (itself checked against MPFR, tests/unit/core/test_formats.cpp) bit for bit on every bf16 value's
// neighbourhood: all 2^16 upper halves with the lower halves that decide a rounding — zero, the
// smallest, just below, at and just above the tie, the largest — so every sign, binade, subnormal,
// overflow to ±inf, infinity and NaN payload is met; and in place on a thread-split array.
// Stochastic rounding likewise equals formats.hpp's bf16_from_f32_sr with the Philox word of each
// element's global index, whatever the split of the calls, and is unbiased.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/core/formats.hpp"
#include "src/core/philox.hpp"

namespace lockstep {
namespace {

TEST(RoundToBf16, EqualsTheFormatsRoundingOnEveryBinadeAndTie) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) in.push_back(std::bit_cast<float>(hi << 16 | lo));
  }
  std::vector<float> out(in.size());
  CpuBackend cpu = CpuBackend::current();
  cpu.round_to_bf16(static_cast<int64_t>(in.size()), out.data(), in.data());
  int64_t mismatches = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(bf16_to_f32(bf16_from_f32(in[i])));
    const uint32_t got = std::bit_cast<uint32_t>(out[i]);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << std::hex << "input 0x" << std::bit_cast<uint32_t>(in[i]) << ": got 0x" << got << ", want 0x"
                    << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // The cases the contract names.
  auto r = [&](float x) {
    float y = x;
    cpu.round_to_bf16(1, &y, &y);
    return std::bit_cast<uint32_t>(y);
  };
  EXPECT_EQ(r(std::bit_cast<float>(0x3f808000u)), 0x3f800000u);  // tie to even: down
  EXPECT_EQ(r(std::bit_cast<float>(0x3f818000u)), 0x3f820000u);  // tie to even: up
  EXPECT_EQ(r(std::bit_cast<float>(0x7f7f8000u)), 0x7f800000u);  // largest finite + half ulp: inf
  EXPECT_EQ(r(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f0000u);  // just below: the largest finite
  EXPECT_EQ(r(std::bit_cast<float>(0x00008000u)), 0x00000000u);  // subnormal tie to even zero
  EXPECT_EQ(r(std::bit_cast<float>(0x00018000u)), 0x00020000u);  // subnormal tie up, kept
  EXPECT_EQ(r(std::bit_cast<float>(0x80000000u)), 0x80000000u);  // -0
  EXPECT_EQ(r(std::bit_cast<float>(0xff800001u)), 0xffc00000u);  // signalling NaN: quiet, signed
}

TEST(RoundToBf16Stochastic, EqualsTheFormatsRoundingWithEachGlobalIndexWord) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0xffff};
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) in.push_back(std::bit_cast<float>(hi << 16 | lo));
  }
  const int64_t n = static_cast<int64_t>(in.size()), first = 3;
  const StochasticKey key{.seed = 99, .tensor = 4, .step = 17};
  std::vector<float> out(in.size());
  CpuBackend cpu = CpuBackend::current();
  cpu.round_to_bf16_stochastic(n, key, first, out.data(), in.data());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = sr_bits(key.seed, key.tensor, key.step, static_cast<uint64_t>(first + i));
    const uint32_t want = std::bit_cast<uint32_t>(bf16_to_f32(bf16_from_f32_sr(in[i], bits)));
    const uint32_t got = std::bit_cast<uint32_t>(out[i]);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << std::hex << "input 0x" << std::bit_cast<uint32_t>(in[i]) << ": got 0x" << got << ", want 0x"
                    << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Any split into calls (odd starts, blocks of four cut) gives the same bits: the words follow the
  // global index.
  std::vector<float> parts(in.size());
  for (int64_t a = 0; a < n;) {
    const int64_t len = std::min<int64_t>(n - a, 1 + (a * 7919) % 40001);
    cpu.round_to_bf16_stochastic(len, key, first + a, parts.data() + a, in.data() + a);
    a += len;
  }
  EXPECT_EQ(std::memcmp(parts.data(), out.data(), sizeof(float) * in.size()), 0);
}

// E[SR(x)] = x: over N steps' words, the fraction rounded up is the dropped part's share of the
// quantum, within 6 binomial standard deviations (the words are fixed: the test is deterministic).
TEST(RoundToBf16Stochastic, IsUnbiased) {
  CpuBackend cpu = CpuBackend::current();
  const int64_t N = 20000;
  for (const float x : {1.0f + 0x1p-9f, -3.14159f, 0x1.0101p-130f, 1e-3f}) {
    const float down = bf16_to_f32(static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16));
    const double quantum = std::fabs(static_cast<double>(std::bit_cast<float>(std::bit_cast<uint32_t>(down) + 0x10000u)) - down);
    const double p = (std::fabs(static_cast<double>(x)) - std::fabs(static_cast<double>(down))) / quantum;
    int64_t ups = 0;
    for (int64_t step = 1; step <= N; ++step) {
      float y = x;
      cpu.round_to_bf16_stochastic(1, {.seed = 5, .tensor = 0, .step = static_cast<uint32_t>(step)}, 12345, &y, &y);
      ASSERT_TRUE(y == down || std::fabs(y) == std::fabs(down) + quantum) << x << " rounded to " << y;
      ups += y != down;
    }
    const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(N));
    EXPECT_NEAR(static_cast<double>(ups) / static_cast<double>(N), p, 6 * sigma) << "x = " << x;
  }
}

}  // namespace
}  // namespace lockstep
