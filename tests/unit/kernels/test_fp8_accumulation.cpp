// The emulated Hopper FP8 accumulator (kernels/ops/fp8_accumulation.hpp): its model on cases
// worked by hand (alignment cuts, normalization, promotion, signs, zeros, non-finite values), its
// Bounded<double> rule holding on products of fp8 values and being tight enough to mean something,
// the model costing accuracy against fp32 accumulation (what it is for), and the CPU kernel in
// fast mode equal to the model's fp32 promotion element by element on any thread count (canonical
// mode is the op driver's: bit for bit the CanonicalF32 reference).
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops/fp8_accumulation.hpp"
#include "kernels/ops/linear.hpp"
#include "reference/bounded.hpp"
#include "reference/fp8_accumulation.hpp"
#include "src/core/formats.hpp"

namespace lockstep {
namespace {

double model(const std::vector<float>& a, const std::vector<float>& b) {
  return fp8_limited_interval(a.data(), 1, b.data(), 1, static_cast<int64_t>(a.size()));
}

TEST(Fp8Accumulation, TermsBelowTheLargestLoseWhatFallsUnderItsThirteenthFractionBit) {
  // 1 and 31 terms of 2^-14: aligned to 1 they are cut to nothing (fp32 keeps all of them).
  std::vector<float> a(32, 0x1p-14f), b(32, 1.0f);
  a[0] = 1.0f;
  EXPECT_EQ(model(a, b), 1.0);
  // 1.5·2^-13 keeps its 2^-13.
  a.assign(32, 0.0f);
  a[0] = 1.0f;
  a[1] = 0x1.8p-13f;
  EXPECT_EQ(model(a, b), 1.0 + 0x1p-13);
  // Negative terms are cut toward zero as well.
  a[0] = -1.0f;
  a[1] = -0x1.8p-13f;
  EXPECT_EQ(model(a, b), -1.0 - 0x1p-13);
}

TEST(Fp8Accumulation, TheSumIsCutToFourteenSignificantBits) {
  std::vector<float> a = {1.0f, 1.0f, 0x1p-13f}, b(3, 1.0f);
  // 2 + 2^-13 needs 15 bits: the accumulator keeps 2.
  EXPECT_EQ(model(a, b), 2.0);
  // Toward zero on either side; 2 - 2^-13 has 14 bits and stays.
  a = {-1.0f, -1.0f, -0x1p-13f};
  EXPECT_EQ(model(a, b), -2.0);
  a = {1.0f, 0x1.ffep-1f, 0x1p-13f};
  EXPECT_EQ(model(a, b), 2.0 - 0x1p-13);
}

TEST(Fp8Accumulation, TheAccumulatorIsAlignedWithEachGroup) {
  // Group 1 leaves L = 2^-14·32 = 2^-9; group 2's term 1 sets the quantum to 2^-13, under which
  // L keeps its 2^-9. Then group 3's 2^12 sets it to 2^-1, and L = 1 + 2^-9 is cut to 1.
  std::vector<float> a(96, 0.0f), b(96, 1.0f);
  for (int i = 0; i < 32; ++i) a[i] = 0x1p-14f;
  a[32] = 1.0f;
  EXPECT_EQ(model(std::vector<float>(a.begin(), a.begin() + 64), std::vector<float>(64, 1.0f)), 1.0 + 0x1p-9);
  a[64] = 4096.0f;
  EXPECT_EQ(model(a, b), 4097.0);
}

TEST(Fp8Accumulation, PromotionStartsEachIntervalAfresh) {
  // 2^12 in interval 0, 128 terms of 2^-6 in interval 1: promoted separately they survive (2), in
  // one interval with 2^12 they would not.
  std::vector<float> a(256, 0.0f), b(256, 1.0f);
  a[0] = 4096.0f;
  for (int i = 128; i < 256; ++i) a[i] = 0x1p-6f;
  EXPECT_EQ(fp8_hopper_dot(Mode::kCanonical, a.data(), 1, b.data(), 1, 256), 4098.0f);
  EXPECT_EQ(fp8_hopper_dot(Mode::kFast, a.data(), 1, b.data(), 1, 256), 4098.0f);
  std::vector<float> one(a.begin(), a.begin() + 128);
  for (int i = 1; i < 128; ++i) one[i] = 0x1p-6f;
  EXPECT_EQ(model(one, std::vector<float>(128, 1.0f)), 4096.0);
}

TEST(Fp8Accumulation, ZerosAndNonFiniteValues) {
  std::vector<float> a(40, 0.0f), b(40, -1.0f);
  const double zero = model(a, b);
  EXPECT_EQ(zero, 0.0);
  EXPECT_FALSE(std::signbit(zero));
  a[3] = 1.0f;
  a[4] = -1.0f;  // an exact cancellation leaves +0
  EXPECT_FALSE(std::signbit(model(a, b)));
  a[35] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(model(a, b), -std::numeric_limits<double>::infinity());
  a[36] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(model(a, b)));
}

// Operands as an fp8 GEMM reads them: e4m3 values (one power-of-two scale per operand).
std::vector<float> fp8_values(std::mt19937_64& rng, int64_t n, float scale) {
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) {
    uint8_t code = static_cast<uint8_t>(rng());
    while ((code & 0x7f) == 0x7f) code = static_cast<uint8_t>(rng());  // not NaN
    x = e4m3_to_f32(code) * scale;
  }
  return out;
}

TEST(Fp8Accumulation, BoundedRuleHoldsAndTheModelIsWorseThanFp32) {
  using Bd = reference::Bounded<double>;
  const reference::ScopedBoundedFormat own_roundings = reference::with_double_roundings();
  std::mt19937_64 rng(17);
  double worst_ratio = 0, hopper_error = 0, fp32_error = 0;
  for (int64_t n : {1, 31, 32, 33, 127, 128, 129, 300, 1024, 4099}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto a = fp8_values(rng, n, 0x1p-4f), b = fp8_values(rng, n, 0x1p-7f);
      const std::vector<Bd> ba(a.begin(), a.end()), bb(b.begin(), b.end());
      const Bd ref = reference::dot_accumulated(Accumulation::kHopperFp8, ba.data(), 1, bb.data(), 1, n);
      for (float got : {fp8_hopper_dot(Mode::kCanonical, a.data(), 1, b.data(), 1, n),
                        fp8_hopper_dot(Mode::kFast, a.data(), 1, b.data(), 1, n)}) {
        const double err = std::fabs(static_cast<double>(got) - ref.value);
        ASSERT_LE(err, ref.err) << "n " << n << " trial " << trial;
        worst_ratio = std::max(worst_ratio, err / ref.err);
      }
      hopper_error += std::fabs(fp8_hopper_dot(Mode::kCanonical, a.data(), 1, b.data(), 1, n) - ref.value);
      fp32_error += std::fabs(canonical_dot(a.data(), 1, b.data(), 1, n) - ref.value);
    }
  }
  // A rule that no case comes near would be a rule about nothing.
  EXPECT_GT(worst_ratio, 0.01);
  // What the emulation is for: a CPU fp8 result no better than the GPU's.
  EXPECT_GT(hopper_error, 8 * fp32_error);
  std::printf("hopper accumulation: worst err/bound %.3g, total |error| %.3g against fp32's %.3g\n", worst_ratio,
              hopper_error, fp32_error);
}

// Operands known only within an error (the Bounded type's err): the model on any operands within
// them stays within the rule's bound of the reference value.
TEST(Fp8Accumulation, BoundedRuleCoversTheOperandsErrors) {
  using Bd = reference::Bounded<double>;
  const reference::ScopedBoundedFormat own_roundings = reference::with_double_roundings();
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<double> unit(-1, 1);
  for (int64_t n : {32, 200, 1000}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto a = fp8_values(rng, n, 1.0f), b = fp8_values(rng, n, 1.0f);
      std::vector<Bd> ba, bb;
      std::vector<float> pa, pb;  // operands moved within their errors
      for (int64_t i = 0; i < n; ++i) {
        const double ea = std::fabs(a[i]) * 0x1p-6, eb = std::fabs(b[i]) * 0x1p-6 + 0x1p-20;
        ba.push_back(Bd{a[i], ea});
        bb.push_back(Bd{b[i], eb});
        pa.push_back(static_cast<float>(a[i] + ea * unit(rng) * 0.99));
        pb.push_back(static_cast<float>(b[i] + eb * unit(rng) * 0.99));
      }
      const Bd ref = reference::dot_accumulated(Accumulation::kHopperFp8, ba.data(), 1, bb.data(), 1, n);
      const double got = fp8_hopper_dot(Mode::kCanonical, pa.data(), 1, pb.data(), 1, n);
      ASSERT_LE(std::fabs(got - ref.value), ref.err) << "n " << n << " trial " << trial;
    }
  }
}

// A full block of eight columns whose second promotion interval holds an infinite product in one
// column: the kernel leaves the vector lanes there for the scalar model and every element is
// still the model's (the finite columns bit for bit, the infinite one infinite), in both modes and
// into an exact accumulator.
TEST(Fp8Accumulation, KernelLeavesTheLanesAtANonFiniteInterval) {
  std::mt19937_64 rng(9);
  const LinearShape s{.N = 3, .IC = 300, .OC = 16, .accumulation = Accumulation::kHopperFp8};
  const auto x = fp8_values(rng, s.N * s.IC, 1.0f);
  auto w = fp8_values(rng, s.OC * s.IC, 0x1p-5f);
  w[5 * s.IC + 150] = std::numeric_limits<float>::infinity();  // column 5, interval 1
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    std::vector<float> got(static_cast<size_t>(s.N * s.OC));
    cpu::linear_forward(mode, s, got.data(), x.data(), w.data(), nullptr);
    ExactAccumulator partials(got.size());
    cpu::linear_forward_partials(s, partials, x.data(), w.data());
    std::vector<float> combined(got.size());
    partials.round_to(combined.data());
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t o = 0; o < s.OC; ++o) {
        const float* xr = &x[n * s.IC];
        const float* wr = &w[o * s.IC];
        const float canonical = fp8_hopper_dot(Mode::kCanonical, xr, 1, wr, 1, s.IC);
        const float want = fp8_hopper_dot(mode, xr, 1, wr, 1, s.IC);
        const size_t i = static_cast<size_t>(n * s.OC + o);
        EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << n << "," << o;
        EXPECT_EQ(std::bit_cast<uint32_t>(combined[i]), std::bit_cast<uint32_t>(canonical)) << n << "," << o;
        if (o == 5) {
          EXPECT_TRUE(std::isinf(got[i]));
        }
      }
    }
  }
}

// The fast kernel's elements are the model's fp32 promotion, whatever the thread count.
TEST(Fp8Accumulation, FastLinearIsTheModelPromotedInFp32OnAnyThreadCount) {
  std::mt19937_64 rng(5);
  const LinearShape s{.N = 7, .IC = 300, .OC = 19, .accumulation = Accumulation::kHopperFp8};
  const auto x = fp8_values(rng, s.N * s.IC, 1.0f), w = fp8_values(rng, s.OC * s.IC, 0x1p-5f);
  std::vector<float> want(static_cast<size_t>(s.N * s.OC));
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t o = 0; o < s.OC; ++o) {
      want[static_cast<size_t>(n * s.OC + o)] = fp8_hopper_dot(Mode::kFast, &x[n * s.IC], 1, &w[o * s.IC], 1, s.IC);
    }
  }
  const int previous = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> got(want.size(), -1.0f);
    cpu::linear_forward(Mode::kFast, s, got.data(), x.data(), w.data(), nullptr);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i << ", threads " << threads;
  }
  omp_set_num_threads(previous);
}

}  // namespace
}  // namespace lockstep
