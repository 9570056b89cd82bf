// The 8-lane ls_expf / ls_tanhf of kernels/cpu/simd_math.hpp against the scalar functions, bit for
// bit (simd_math_check.hpp). The kernels are built with -mavx2 -mfma (their floor,
// kernels/cpu/isa.hpp); this file is built with the test flags, so it asks for the same
// instruction set here.
#pragma GCC target("avx2,fma")

#include "tests/unit/kernels_elementwise/simd_math_check.hpp"

namespace lockstep {
namespace {

TEST(SimdMath, ExpfMatchesScalarBitwise) {
  EXPECT_EQ(mismatches<cpu::simd::Avx2>("expf8", inputs(), cpu::simd::expf8, ls_expf), 0);
}

TEST(SimdMath, TanhfMatchesScalarBitwise) {
  EXPECT_EQ(mismatches<cpu::simd::Avx2>("tanhf8", inputs(), cpu::simd::tanhf8, ls_tanhf), 0);
}

}  // namespace
}  // namespace lockstep
