// The CPU's rounding to bf16 (kernels/ops/cast.hpp) equals src/core/formats.hpp's bf16_from_f32
// (itself checked against MPFR, tests/unit/core/test_formats.cpp) bit for bit on every bf16 value's
// neighbourhood: all 2^16 upper halves with the lower halves that decide a rounding — zero, the
// smallest, just below, at and just above the tie, the largest — so every sign, binade, subnormal,
// overflow to ±inf, infinity and NaN payload is met; and in place on a thread-split array.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/core/formats.hpp"

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

}  // namespace
}  // namespace lockstep
