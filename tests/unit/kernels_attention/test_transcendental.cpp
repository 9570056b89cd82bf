// ls_expf, ls_logf, ls_tanhf (kernels/ops/transcendental.hpp) against MPFR.
//
// Every 64th fp32 bit pattern of the range where each function does real work (the rest —
// exp of tiny x, log far from 1, tanh near 0 or saturated — is sampled more sparsely, since the
// reduction there is exact and the polynomial sees the same reduced arguments), plus the special
// values. The tolerance is the one the Bounded reference charges every transcendental,
// reference::bounded_format().transcendental_units·u relative, plus bounded_format().underflow
// absolute where the result is subnormal. MPFR evaluates at 64 bits and rounds to double: the
// oracle is off by < 2^-52 relative, 2^-25 of the tolerance.
#include <gtest/gtest.h>
#include <mpfr.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <vector>

#include "kernels/ops/transcendental.hpp"
#include "reference/bounded.hpp"

namespace lockstep {
namespace {

using Mpfr = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// One 64-bit MPFR variable per thread, initialised once (MPFR is thread-safe per variable).
struct MpfrScratch {
  mpfr_t v;
  MpfrScratch() { mpfr_init2(v, 64); }
  ~MpfrScratch() { mpfr_clear(v); }
};

double mpfr_oracle(Mpfr fn, float x) {
  thread_local MpfrScratch s;
  mpfr_set_flt(s.v, x, MPFR_RNDN);
  fn(s.v, s.v, MPFR_RNDN);
  return mpfr_get_d(s.v, MPFR_RNDN);
}

struct Sweep {
  double max_rel_units = 0;  // max |got − want| / (u·|want|) over normal results
  float worst = 0;
  int64_t count = 0;
  int64_t failures = 0;
};

// Checks fn against the MPFR oracle on bit patterns [lo, hi] with the given stride.
template <class Fn>
Sweep sweep(Fn fn, Mpfr oracle, uint32_t lo, uint32_t hi, uint32_t stride) {
  const auto& fmt = reference::bounded_format();
  const double tol_units = fmt.transcendental_units;
  Sweep total;
  const int64_t n = (static_cast<int64_t>(hi) - lo) / stride + 1;
#pragma omp parallel
  {
    Sweep mine;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = from_bits(static_cast<uint32_t>(lo + i * int64_t{stride}));
      const float got = fn(x);
      const double want = mpfr_oracle(oracle, x);
      ++mine.count;
      bool ok;
      if (!std::isfinite(want) || !std::isfinite(got)) {
        ok = (std::isnan(want) && std::isnan(got)) || double(got) == want ||
             // The oracle overflowed double (never for fp32 inputs here) or rounds to fp32 inf.
             (std::isinf(got) && std::isinf(static_cast<float>(want)) && (got > 0) == (want > 0));
      } else {
        const double err = std::fabs(double(got) - want);
        ok = err <= tol_units * fmt.u * std::fabs(want) + fmt.underflow;
        if (std::fabs(want) >= 0x1p-126 && want != 0) {
          const double units = err / (fmt.u * std::fabs(want));
          if (units > mine.max_rel_units) {
            mine.max_rel_units = units;
            mine.worst = x;
          }
        }
      }
      if (!ok) {
        ++mine.failures;
#pragma omp critical
        if (mine.failures <= 3) {
          ADD_FAILURE() << "x = " << std::hexfloat << x << " got " << got << " want " << want;
        }
      }
    }
#pragma omp critical
    {
      total.count += mine.count;
      total.failures += mine.failures;
      if (mine.max_rel_units > total.max_rel_units) {
        total.max_rel_units = mine.max_rel_units;
        total.worst = mine.worst;
      }
    }
  }
  return total;
}

void report(const char* what, const Sweep& s) {
  std::cout << what << ": " << s.count << " inputs, max error " << s.max_rel_units
            << " u (at x = " << std::hexfloat << s.worst << std::defaultfloat << "), tolerance "
            << reference::bounded_format().transcendental_units << " u\n";
  EXPECT_EQ(s.failures, 0) << what;
}

constexpr uint32_t kSign = 0x80000000u;

TEST(Transcendental, ExpWithinTwoUlpOfMpfr) {
  auto f = [](float x) { return ls_expf(x); };
  // Dense: |x| in [1/4, 1), where k is 0 or ±1 and the reduced argument r sweeps all of
  // [−ln2/2, ln2/2] (larger |x| only adds k·ln2 exactly and scales by 2^k).
  Sweep a = sweep(f, mpfr_exp, 0x3e800000u, 0x3f800000u, 64);
  Sweep b = sweep(f, mpfr_exp, kSign | 0x3e800000u, kSign | 0x3f800000u, 64);
  // Medium: |x| in [2^-26, 104] (e^x of smaller |x| rounds to 1), overflow and underflow
  // thresholds included; sparse: the rest of the line, subnormals to infinities.
  Sweep c = sweep(f, mpfr_exp, 0x32800000u, 0x42d00000u, 1u << 10);
  Sweep d = sweep(f, mpfr_exp, kSign | 0x32800000u, kSign | 0x42d00000u, 1u << 10);
  Sweep e = sweep(f, mpfr_exp, 0x00000000u, 0x7f800000u, 1u << 14);
  Sweep g = sweep(f, mpfr_exp, kSign, kSign | 0x7f800000u, 1u << 14);
  report("ls_expf [1/4,1) dense", a);
  report("ls_expf (-1,-1/4] dense", b);
  report("ls_expf [2^-26,104]", c);
  report("ls_expf [-104,-2^-26]", d);
  report("ls_expf x>0 sparse", e);
  report("ls_expf x<0 sparse", g);
}

TEST(Transcendental, LogWithinTwoUlpOfMpfr) {
  auto f = [](float x) { return ls_logf(x); };
  Sweep a = sweep(f, mpfr_log, 0x3e800000u, 0x40800000u, 64);   // [1/4, 4]: small results
  Sweep b = sweep(f, mpfr_log, 0x00000001u, 0x7f800000u, 1u << 13);  // every binade
  Sweep c = sweep(f, mpfr_log, 0x00000001u, 0x00800000u, 1u << 10);   // subnormals
  report("ls_logf [1/4,4] dense", a);
  report("ls_logf all positive sparse", b);
  report("ls_logf subnormal", c);
}

TEST(Transcendental, TanhWithinTolOfMpfr) {
  auto f = [](float x) { return ls_tanhf(x); };
  // Dense over [1/16, 4): both branches (the switch is at 0.9) and the whole transition to 1.
  Sweep a = sweep(f, mpfr_tanh, 0x3d800000u, 0x40800000u, 64);
  Sweep b = sweep(f, mpfr_tanh, kSign | 0x39000000u, kSign | 0x41200000u, 1u << 10);
  Sweep c = sweep(f, mpfr_tanh, 0x00000000u, 0x7f800000u, 1u << 14);
  Sweep d = sweep(f, mpfr_tanh, kSign, kSign | 0x7f800000u, 1u << 14);
  report("ls_tanhf [1/16,4) dense", a);
  report("ls_tanhf [-10,-2^-13]", b);
  report("ls_tanhf x>0 sparse", c);
  report("ls_tanhf x<0 sparse", d);
}

// Bitwise special values: signs of zero, infinities, NaN and the edges of the finite range.
TEST(Transcendental, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denorm_min = std::numeric_limits<float>::denorm_min();
  auto same = [](float a, float b) {
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
  };
  EXPECT_TRUE(same(ls_expf(0.0f), 1.0f));
  EXPECT_TRUE(same(ls_expf(-0.0f), 1.0f));
  EXPECT_TRUE(same(ls_expf(inf), inf));
  EXPECT_TRUE(same(ls_expf(-inf), 0.0f));
  EXPECT_TRUE(std::isnan(ls_expf(nan)));
  EXPECT_TRUE(same(ls_expf(denorm_min), 1.0f));
  EXPECT_TRUE(same(ls_expf(-denorm_min), 1.0f));
  // Overflow threshold: the largest x with a finite fp32 e^x, as MPFR rounds it, and its successor.
  const float x_max = 0x1.62e42ep6f;
  ASSERT_TRUE(std::isfinite(static_cast<float>(mpfr_oracle(mpfr_exp, x_max))));
  ASSERT_TRUE(std::isinf(static_cast<float>(mpfr_oracle(mpfr_exp, std::nextafter(x_max, inf)))));
  EXPECT_TRUE(std::isfinite(ls_expf(x_max)));
  EXPECT_TRUE(same(ls_expf(std::nextafter(x_max, inf)), inf));
  EXPECT_TRUE(same(ls_expf(1000.0f), inf));
  // Underflow: e^x rounds to the smallest subnormal near ln(2^-149), to +0 below ln(2^-150).
  EXPECT_TRUE(same(ls_expf(-103.2789f), denorm_min));
  EXPECT_TRUE(same(ls_expf(-104.0f), 0.0f));
  EXPECT_TRUE(same(ls_expf(-1000.0f), 0.0f));

  EXPECT_TRUE(same(ls_logf(1.0f), 0.0f));
  EXPECT_TRUE(same(ls_logf(0.0f), -inf));
  EXPECT_TRUE(same(ls_logf(-0.0f), -inf));
  EXPECT_TRUE(same(ls_logf(inf), inf));
  EXPECT_TRUE(std::isnan(ls_logf(-1.0f)));
  EXPECT_TRUE(std::isnan(ls_logf(-denorm_min)));
  EXPECT_TRUE(std::isnan(ls_logf(-inf)));
  EXPECT_TRUE(std::isnan(ls_logf(nan)));
  const double log_denorm_min = -149 * std::log(2.0);
  EXPECT_LE(std::fabs(ls_logf(denorm_min) - log_denorm_min),
            reference::bounded_format().transcendental_units * reference::bounded_format().u *
                std::fabs(log_denorm_min));

  EXPECT_TRUE(same(ls_tanhf(0.0f), 0.0f));
  EXPECT_TRUE(same(ls_tanhf(-0.0f), -0.0f));
  EXPECT_TRUE(same(ls_tanhf(denorm_min), denorm_min));
  EXPECT_TRUE(same(ls_tanhf(-denorm_min), -denorm_min));
  EXPECT_TRUE(same(ls_tanhf(inf), 1.0f));
  EXPECT_TRUE(same(ls_tanhf(-inf), -1.0f));
  EXPECT_TRUE(same(ls_tanhf(9.1f), 1.0f));  // 1 − tanh(9.1) < 2^-25: saturated
  EXPECT_TRUE(same(ls_tanhf(-20.0f), -1.0f));
  EXPECT_TRUE(std::isnan(ls_tanhf(nan)));
}

}  // namespace
}  // namespace lockstep
