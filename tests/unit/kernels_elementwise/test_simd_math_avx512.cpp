// The 16-lane ls_expf / ls_tanhf of kernels/cpu/simd_math.hpp (the same definitions as the 8-lane
// ones over the Avx512 width) against the scalar functions, bit for bit (simd_math_check.hpp).
// tests/CMakeLists.txt compiles this file for AVX-512 as the kernels' avx512 build is; the tests
// skip on a CPU without it.

#include "kernels/cpu/isa.hpp"
#include "tests/unit/kernels_elementwise/simd_math_check.hpp"

namespace lockstep {
namespace {

using cpu::simd::Avx512;

TEST(SimdMath, Expf16MatchesScalarBitwise) {
  if (!cpu::isa_supported(cpu::Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  EXPECT_EQ(mismatches<Avx512>("expf<Avx512>", inputs(), cpu::simd::expf<Avx512>, ls_expf), 0);
}

TEST(SimdMath, Tanhf16MatchesScalarBitwise) {
  if (!cpu::isa_supported(cpu::Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  EXPECT_EQ(mismatches<Avx512>("tanhf<Avx512>", inputs(), cpu::simd::tanhf<Avx512>, ls_tanhf), 0);
}

}  // namespace
}  // namespace lockstep
