// Tests of src/core/formats.hpp against MPFR, MPFR-tests style: every bf16/fp16/fp8/E8M0 pattern
// exhaustively, every rounding boundary of every format, and millions of random fp32 inputs, each
// compared with the correctly rounded MPFR result bit for bit (value and sign of zero). MPFR
// values of the patterns are built from the sign/exponent/mantissa fields, not from formats.hpp.
// Stochastic rounding: always one of the two neighbours, exact values unchanged, and the frequency
// of rounding up within a Hoeffding bound of its exact probability.
#include "src/core/formats.hpp"

#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/core/philox.hpp"

namespace lockstep {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// One narrow format under test, with type-erased conversions.
struct FormatCase {
  const FormatInfo* info;
  bool fp8;  // has the two saturation modes; bf16/fp16 follow IEEE (overflow -> inf)
  float (*to_f32)(uint32_t);
  uint32_t (*rne)(float, Saturation);
  uint32_t (*sr)(float, uint32_t, Saturation);
};

const FormatCase kBf16{&kBF16Info, false,
                       [](uint32_t c) { return bf16_to_f32(static_cast<uint16_t>(c)); },
                       [](float x, Saturation) { return uint32_t{bf16_from_f32(x)}; },
                       [](float x, uint32_t r, Saturation) { return uint32_t{bf16_from_f32_sr(x, r)}; }};
const FormatCase kF16{&kF16Info, false,
                      [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); },
                      [](float x, Saturation) { return uint32_t{f16_from_f32(x)}; },
                      [](float x, uint32_t r, Saturation) { return uint32_t{f16_from_f32_sr(x, r)}; }};
const FormatCase kE4M3{&kE4M3Info, true,
                       [](uint32_t c) { return e4m3_to_f32(static_cast<uint8_t>(c)); },
                       [](float x, Saturation s) { return uint32_t{e4m3_from_f32(x, s)}; },
                       [](float x, uint32_t r, Saturation s) { return uint32_t{e4m3_from_f32_sr(x, r, s)}; }};
const FormatCase kE5M2{&kE5M2Info, true,
                       [](uint32_t c) { return e5m2_to_f32(static_cast<uint8_t>(c)); },
                       [](float x, Saturation s) { return uint32_t{e5m2_from_f32(x, s)}; },
                       [](float x, uint32_t r, Saturation s) { return uint32_t{e5m2_from_f32_sr(x, r, s)}; }};
const FormatCase* const kAllCases[] = {&kBf16, &kF16, &kE4M3, &kE5M2};

std::vector<Saturation> modes_of(const FormatCase& f) {
  if (f.fp8) return {Saturation::kSaturate, Saturation::kNonSaturating};
  return {Saturation::kNonSaturating};
}

const char* mode_name(Saturation s) { return s == Saturation::kSaturate ? "saturate" : "non-saturating"; }

enum class Kind { kFinite, kInf, kNaN };

// The value of bit pattern `code` of a signed narrow format, from its fields (IEEE 754 encoding;
// E4M3 "FN": all-ones exponent is finite except S.1111.111 = NaN, no inf).
Kind pattern_value(mpfr_t out, const FormatInfo& f, uint32_t code) {
  const uint32_t man = code & ((1u << f.man_bits) - 1);
  const uint32_t exp = (code >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const bool negative = (code >> (f.exp_bits + f.man_bits)) & 1;
  const uint32_t exp_ones = (1u << f.exp_bits) - 1;
  if (f.has_inf && exp == exp_ones) {
    if (man != 0) return Kind::kNaN;
    mpfr_set_inf(out, negative ? -1 : 1);
    return Kind::kInf;
  }
  if (!f.has_inf && exp == exp_ones && man == (1u << f.man_bits) - 1) return Kind::kNaN;
  if (exp == 0) {  // subnormal or zero: man * 2^(1 - bias - man_bits)
    mpfr_set_ui(out, man, MPFR_RNDN);
    mpfr_mul_2si(out, out, 1 - f.bias - f.man_bits, MPFR_RNDN);
  } else {  // (2^man_bits + man) * 2^(exp - bias - man_bits)
    mpfr_set_ui(out, (1u << f.man_bits) + man, MPFR_RNDN);
    mpfr_mul_2si(out, out, static_cast<long>(exp) - f.bias - f.man_bits, MPFR_RNDN);
  }
  if (negative) mpfr_neg(out, out, MPFR_RNDN);  // gives -0 for the negative zero pattern
  return Kind::kFinite;
}

// x rounded by MPFR to the precision and subnormal range of a format, with the exponent unbounded
// above (the caller applies overflow). MPFR's emin is the exponent, in its [0.5, 1) significand
// convention, of the smallest subnormal: 2^(1 - bias - man_bits) = 0.5 * 2^(2 - bias - man_bits).
class MpfrRounder {
 public:
  explicit MpfrRounder(const FormatInfo& f) : emin_(2 - f.bias - f.man_bits) {
    mpfr_init2(y_, f.man_bits + 1);
  }
  ~MpfrRounder() { mpfr_clear(y_); }
  MpfrRounder(const MpfrRounder&) = delete;
  MpfrRounder& operator=(const MpfrRounder&) = delete;

  double round(float x, mpfr_rnd_t rnd) {
    const mpfr_exp_t old_emin = mpfr_get_emin();
    mpfr_set_emin(emin_);
    int t = mpfr_set_flt(y_, x, rnd);
    t = mpfr_subnormalize(y_, t, rnd);
    const double r = mpfr_get_d(y_, MPFR_RNDN);  // exact: at most 23 bits, in double's range
    mpfr_set_emin(old_emin);
    return r;
  }

 private:
  mpfr_exp_t emin_;
  mpfr_t y_;
};

// What narrowing x must give, as a value: NaN, ±inf, or a finite value with the sign of zero.
double expected_narrow(const FormatCase& f, MpfrRounder& rounder, float x, Saturation sat,
                       mpfr_rnd_t rnd) {
  if (std::isnan(x)) return std::copysign(kNaN, x);
  const double r = std::isinf(x) ? double{x} : rounder.round(x, rnd);
  if (std::fabs(r) > f.info->max_finite) {
    if (f.fp8 && sat == Saturation::kSaturate) return std::copysign(f.info->max_finite, x);
    return std::copysign(f.info->has_inf ? kInf : kNaN, x);
  }
  return r;
}

// Same value and same sign (of zero and of NaN); NaN matches any NaN.
bool same_value(double expected, float got) {
  if (std::signbit(expected) != std::signbit(got)) return false;
  if (std::isnan(expected)) return std::isnan(got);
  return expected == double{got};
}

// Bits of x, sign/exponent/mantissa, for failure messages.
std::string fp32_binary(float x) {
  const uint32_t b = f32_bits(x);
  std::string s;
  for (int i = 31; i >= 0; --i) {
    s += char('0' + ((b >> i) & 1));
    if (i == 31 || i == 23) s += '.';
  }
  return s;
}

// Accumulates mismatches, printing the first few, so that a broken rule does not flood the log.
struct Mismatches {
  int count = 0;
  void report(const FormatCase& f, const char* what, float x, Saturation sat, double expected,
              uint32_t got_code, float got) {
    if (++count <= 10) {
      ADD_FAILURE() << f.info->name << " " << what << " (" << mode_name(sat) << "): x = " << x
                    << " = " << fp32_binary(x) << ", expected " << expected << ", got code 0x"
                    << std::hex << got_code << std::dec << " = " << got;
    }
  }
};

void check_rne(const FormatCase& f, MpfrRounder& rounder, float x, Mismatches& bad) {
  for (Saturation sat : modes_of(f)) {
    const double expected = expected_narrow(f, rounder, x, sat, MPFR_RNDN);
    const uint32_t code = f.rne(x, sat);
    const float got = f.to_f32(code);
    if (!same_value(expected, got)) bad.report(f, "RNE", x, sat, expected, code, got);
  }
}

TEST(Formats, PropertiesMatchTheStandards) {
  // docs/numerics.md table (IEEE 754-2019, OCP OFP8 rev 1.0, OCP MX v1.0).
  struct Row { const FormatInfo* f; int bits, bias; double u, max, min_normal, min_sub; };
  const Row rows[] = {
      {&kF32Info, 32, 127, std::ldexp(1.0, -24), double{std::numeric_limits<float>::max()},
       std::ldexp(1.0, -126), std::ldexp(1.0, -149)},
      {&kBF16Info, 16, 127, std::ldexp(1.0, -8), std::ldexp(255.0, 120), std::ldexp(1.0, -126),
       std::ldexp(1.0, -133)},
      {&kF16Info, 16, 15, std::ldexp(1.0, -11), 65504.0, std::ldexp(1.0, -14), std::ldexp(1.0, -24)},
      {&kE4M3Info, 8, 7, std::ldexp(1.0, -4), 448.0, std::ldexp(1.0, -6), std::ldexp(1.0, -9)},
      {&kE5M2Info, 8, 15, std::ldexp(1.0, -3), 57344.0, std::ldexp(1.0, -14), std::ldexp(1.0, -16)},
      {&kE8M0Info, 8, 127, kNaN, std::ldexp(1.0, 127), std::ldexp(1.0, -127), std::ldexp(1.0, -127)},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.f->name);
    EXPECT_EQ(r.f->bits, r.bits);
    EXPECT_EQ(r.f->bias, r.bias);
    if (std::isnan(r.u)) {
      EXPECT_TRUE(std::isnan(r.f->unit_roundoff));
    } else {
      EXPECT_EQ(r.f->unit_roundoff, r.u);
    }
    EXPECT_EQ(r.f->max_finite, r.max);
    EXPECT_EQ(r.f->min_normal, r.min_normal);
    EXPECT_EQ(r.f->min_subnormal, r.min_sub);
  }
}

// Every pattern: the fp32 value equals MPFR's value of the fields, and narrowing it back (RNE,
// every mode) returns the pattern. NaN policy: NaN widens to a NaN of the same sign and narrows to
// a NaN pattern of the same sign; ±inf (E5M2, bf16, fp16) narrows back to ±inf except in
// saturating mode, where it gives ±max finite.
TEST(Formats, EveryPatternWidensExactlyAndRoundTrips) {
  mpfr_t v, back;
  mpfr_init2(v, 64);
  mpfr_init2(back, 64);
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    int failures = 0;
    for (uint32_t code = 0; code < (1u << f->info->bits); ++code) {
      const Kind kind = pattern_value(v, *f->info, code);
      const float w = f->to_f32(code);
      const bool negative = (code >> (f->info->bits - 1)) & 1;
      bool ok = std::signbit(w) == negative;
      for (Saturation sat : modes_of(*f)) {
        const uint32_t n = f->rne(w, sat);
        if (kind == Kind::kNaN) {
          ok = ok && std::isnan(w) && pattern_value(back, *f->info, n) == Kind::kNaN &&
               ((n >> (f->info->bits - 1)) & 1) == negative;
        } else if (kind == Kind::kInf) {
          const uint32_t max_code = (code & ~(1u << (f->info->bits - 1))) - 1;
          const uint32_t sign_bit = negative ? 1u << (f->info->bits - 1) : 0u;
          ok = ok && std::isinf(w) &&
               n == (f->fp8 && sat == Saturation::kSaturate ? (sign_bit | max_code) : code);
        } else {
          ok = ok && mpfr_cmp_d(v, w) == 0 && n == code;
        }
      }
      if (!ok && ++failures <= 10) {
        ADD_FAILURE() << "pattern 0x" << std::hex << code << std::dec << " widened to " << w
                      << " (" << fp32_binary(w) << "), MPFR value " << mpfr_get_d(v, MPFR_RNDN);
      }
    }
    EXPECT_EQ(failures, 0);
  }
  mpfr_clear(v);
  mpfr_clear(back);
}

TEST(Formats, PropertiesMatchTheEncodings) {
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    const uint32_t max_code = f->rne(f->info->max_finite, Saturation::kNonSaturating);
    EXPECT_EQ(double{f->to_f32(max_code)}, f->info->max_finite);
    EXPECT_TRUE(double{f->to_f32(max_code + 1)} == kInf || std::isnan(f->to_f32(max_code + 1)));
    EXPECT_EQ(double{f->to_f32(1)}, f->info->min_subnormal);
    EXPECT_EQ(double{f->to_f32(1u << f->info->man_bits)}, f->info->min_normal);
    EXPECT_EQ(double{f->to_f32(f->rne(1.0f, Saturation::kNonSaturating) + 1)} - 1.0,
              2.0 * f->info->unit_roundoff);  // the gap above 1 is 2u
  }
}

// Every rounding boundary: for each pair of consecutive non-negative finite values lo < hi (and
// the pair max finite < max + ulp, where overflow begins), the values lo, hi, the midpoint and the
// fp32 neighbours of the midpoint, with both signs.
TEST(Formats, RneMatchesMpfrAtEveryMidpoint) {
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    MpfrRounder rounder(*f->info);
    Mismatches bad;
    const uint32_t max_code = f->rne(f->info->max_finite, Saturation::kNonSaturating);
    for (uint32_t c = 0; c <= max_code; ++c) {
      const double lo = f->to_f32(c);
      const double hi = c < max_code ? double{f->to_f32(c + 1)}
                                     : 2.0 * f->info->max_finite - f->to_f32(max_code - 1);
      const double mid_d = 0.5 * (lo + hi);
      const auto mid = static_cast<float>(mid_d);
      ASSERT_EQ(double{mid}, mid_d) << "midpoint not an fp32 value";
      std::vector<float> xs = {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f),
                               std::nextafter(mid, std::numeric_limits<float>::infinity())};
      if (hi <= std::numeric_limits<float>::max()) xs.push_back(static_cast<float>(hi));  // bf16: 2^128 is not
      for (float x : xs) {
        check_rne(*f, rounder, x, bad);
        check_rne(*f, rounder, -x, bad);
      }
    }
    EXPECT_EQ(bad.count, 0);
  }
}

TEST(Formats, RneMatchesMpfrOnSpecialValues) {
  const float kF32Max = std::numeric_limits<float>::max();
  const float specials[] = {0.0f, std::numeric_limits<float>::denorm_min(),
                            std::nextafter(std::numeric_limits<float>::min(), 0.0f),
                            std::numeric_limits<float>::min(), 1.0f, kF32Max,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 464.0f, 480.0f, 61440.0f,
                            65504.0f, 65520.0f, 65536.0f};
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    MpfrRounder rounder(*f->info);
    Mismatches bad;
    for (float x : specials) {
      check_rne(*f, rounder, x, bad);
      check_rne(*f, rounder, -x, bad);
    }
    EXPECT_EQ(bad.count, 0);
  }
  // The OCP fp8 boundaries written out: 464 ties to even 448 (mantissa 110); just above, E4M3
  // overflows. 61440 ties between 57344 (odd mantissa 11) and 65536: it overflows in E5M2.
  EXPECT_EQ(e4m3_from_f32(464.0f, Saturation::kNonSaturating), 0x7E);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(464.0f, 500.0f), Saturation::kNonSaturating), 0x7F);
  EXPECT_EQ(e4m3_from_f32(std::nextafter(464.0f, 500.0f), Saturation::kSaturate), 0x7E);
  EXPECT_EQ(e4m3_from_f32(-std::numeric_limits<float>::infinity(), Saturation::kSaturate), 0xFE);
  EXPECT_EQ(e4m3_from_f32(-std::numeric_limits<float>::infinity(), Saturation::kNonSaturating), 0xFF);
  EXPECT_EQ(e5m2_from_f32(61440.0f, Saturation::kNonSaturating), 0x7C);
  EXPECT_EQ(e5m2_from_f32(61440.0f, Saturation::kSaturate), 0x7B);
  EXPECT_EQ(e5m2_from_f32(std::numeric_limits<float>::infinity(), Saturation::kNonSaturating), 0x7C);
}

// Random fp32 with the exponent spread over the format's range and a little beyond (subnormals,
// underflow to zero, overflow), then raw random bit patterns (mostly far out of fp8 range).
float random_in_range(std::mt19937_64& rng, const FormatInfo& f) {
  const int lo = 1 - f.bias - f.man_bits - 3;
  const int hi = static_cast<int>(std::floor(std::log2(f.max_finite))) + 2;
  const int e = std::uniform_int_distribution<int>(lo, std::min(hi, 127))(rng);
  const uint32_t m = static_cast<uint32_t>(rng()) & 0x7fffffu;
  const uint32_t sign = static_cast<uint32_t>(rng() & 1) << 31;
  const uint32_t bits = e >= -126 ? (static_cast<uint32_t>(e + 127) << 23) | m
                                  : (m | 0x800000u) >> (-126 - e);
  return f32_from_bits(sign | bits);
}

TEST(Formats, RneMatchesMpfrOnRandomFp32) {
  constexpr int kInRange = 1 << 19;
  constexpr int kRawBits = 1 << 19;
  std::mt19937_64 rng(20240611);
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    MpfrRounder rounder(*f->info);
    Mismatches bad;
    for (int i = 0; i < kInRange; ++i) check_rne(*f, rounder, random_in_range(rng, *f->info), bad);
    for (int i = 0; i < kRawBits; ++i) check_rne(*f, rounder, f32_from_bits(static_cast<uint32_t>(rng())), bad);
    EXPECT_EQ(bad.count, 0);
  }
}

// Stochastic rounding gives RD(x) or RU(x) (after the overflow rule of the mode), x itself when x
// is representable, RZ(x) for random bits 0 and RA(x) for all-ones bits (the latter only where the
// dropped part spans at most 32 bits: |x| >= min_subnormal * 2^-8 suffices).
TEST(Formats, StochasticRoundingPicksANeighbour) {
  constexpr int kValues = 1 << 16;
  std::mt19937_64 rng(7);
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    MpfrRounder rounder(*f->info);
    Mismatches bad;
    for (int i = 0; i < kValues; ++i) {
      const float x = random_in_range(rng, *f->info);
      const auto r = static_cast<uint32_t>(rng());
      for (Saturation sat : modes_of(*f)) {
        const double down = expected_narrow(*f, rounder, x, sat, MPFR_RNDD);
        const double up = expected_narrow(*f, rounder, x, sat, MPFR_RNDU);
        const uint32_t code = f->sr(x, r, sat);
        const float got = f->to_f32(code);
        if (!same_value(down, got) && !same_value(up, got)) bad.report(*f, "SR", x, sat, down, code, got);
        if (down == up && !same_value(down, got)) bad.report(*f, "SR exact", x, sat, down, code, got);
        const double rz = expected_narrow(*f, rounder, x, sat, MPFR_RNDZ);
        const uint32_t code0 = f->sr(x, 0, sat);
        if (!same_value(rz, f->to_f32(code0))) bad.report(*f, "SR bits 0", x, sat, rz, code0, f->to_f32(code0));
        if (std::fabs(x) >= std::ldexp(f->info->min_subnormal, -8)) {
          const double ra = expected_narrow(*f, rounder, x, sat, MPFR_RNDA);
          const uint32_t code1 = f->sr(x, 0xffffffffu, sat);
          if (!same_value(ra, f->to_f32(code1))) bad.report(*f, "SR bits ~0", x, sat, ra, code1, f->to_f32(code1));
        }
      }
    }
    EXPECT_EQ(bad.count, 0);
  }
}

// Unbiasedness: x between neighbours lo < hi rounds up with probability p = (x - lo)/(hi - lo).
// Over N Philox draws, Hoeffding gives P(|ups/N - p| >= t) <= 2 exp(-2 N t^2) = kDelta, so the
// observed frequency must lie within t of p (E[result] = x exactly when it does).
TEST(Formats, StochasticRoundingIsUnbiasedWithinHoeffdingBound) {
  constexpr int kDraws = 20000;
  constexpr int kValuesPerFormat = 40;
  constexpr double kDelta = 1e-9;  // false-alarm probability per value
  const double t = std::sqrt(std::log(2.0 / kDelta) / (2.0 * kDraws));
  std::mt19937_64 rng(99);
  uint32_t tensor_id = 0;
  for (const FormatCase* f : kAllCases) {
    SCOPED_TRACE(f->info->name);
    MpfrRounder rounder(*f->info);
    for (int v = 0; v < kValuesPerFormat; ++v) {
      float x;
      do {  // finite, inside the range, not representable
        x = random_in_range(rng, *f->info);
      } while (std::fabs(x) >= f->info->max_finite ||
               rounder.round(x, MPFR_RNDD) == rounder.round(x, MPFR_RNDU));
      const double lo = rounder.round(x, MPFR_RNDD);
      const double hi = rounder.round(x, MPFR_RNDU);
      const double p = (double{x} - lo) / (hi - lo);  // exact operands; the quotient rounds once
      ++tensor_id;
      for (Saturation sat : modes_of(*f)) {
        int ups = 0;
        for (uint64_t i = 0; i < kDraws; ++i) {
          const uint32_t code = f->sr(x, sr_bits(1234, tensor_id, 0, i), sat);
          const double got = f->to_f32(code);
          ASSERT_TRUE(got == lo || got == hi) << x;
          ups += got == hi;
          // Same (seed, tensor, step, index): same bits, same result.
          if (i < 4) {
            ASSERT_EQ(code, f->sr(x, sr_bits(1234, tensor_id, 0, i), sat));
          }
        }
        EXPECT_LE(std::fabs(ups / double(kDraws) - p), t)
            << "x = " << x << " between " << lo << " and " << hi << ", p = " << p << ", "
            << mode_name(sat) << ", Hoeffding t = " << t << " at delta " << kDelta;
      }
    }
  }
}

// E8M0: every pattern widens to 2^(c-127) (0xFF: NaN) and narrows back; fp32 -> E8M0 is
// 2^floor(log2|x|) clamped to [2^-127, 2^127], checked against MPFR's exponent on random inputs.
TEST(Formats, E8M0EveryPatternAndFloorRule) {
  mpfr_t v;
  mpfr_init2(v, 64);
  for (uint32_t c = 0; c < 255; ++c) {
    mpfr_set_ui(v, 1, MPFR_RNDN);
    mpfr_mul_2si(v, v, static_cast<long>(c) - 127, MPFR_RNDN);
    const float w = e8m0_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(mpfr_cmp_d(v, w), 0) << c;
    EXPECT_EQ(e8m0_from_f32_floor(w), c);
    EXPECT_EQ(e8m0_from_exponent(static_cast<int>(c) - 127), c);
    if (c > 0) {
      EXPECT_EQ(e8m0_from_f32_floor(std::nextafter(w, 0.0f)), c - 1) << c;
    }
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(kE8M0NaN)));
  EXPECT_EQ(e8m0_from_f32_floor(e8m0_to_f32(kE8M0NaN)), kE8M0NaN);
  EXPECT_EQ(e8m0_from_f32_floor(std::numeric_limits<float>::infinity()), kE8M0NaN);
  EXPECT_EQ(e8m0_from_f32_floor(0.0f), 0);
  EXPECT_EQ(e8m0_from_exponent(-500), 0);
  EXPECT_EQ(e8m0_from_exponent(128), 0xFE);

  std::mt19937_64 rng(5);
  int failures = 0;
  for (int i = 0; i < (1 << 18); ++i) {
    const float x = f32_from_bits(static_cast<uint32_t>(rng()));
    if (!std::isfinite(x) || x == 0.0f) continue;
    mpfr_set_flt(v, x, MPFR_RNDN);
    const long e = static_cast<long>(mpfr_get_exp(v)) - 1;  // floor(log2|x|)
    const long expected = std::clamp(e, -127L, 127L) + 127;
    if (e8m0_from_f32_floor(x) != expected && ++failures <= 10) {
      ADD_FAILURE() << "x = " << x << " (" << fp32_binary(x) << "): expected " << expected;
    }
  }
  EXPECT_EQ(failures, 0);
  mpfr_clear(v);
}

}  // namespace
}  // namespace lockstep
