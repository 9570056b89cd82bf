// Tests of src/core/exact_sum.hpp against MPFR: the exact sum is computed in MPFR at a precision
// that makes every addition exact (checked through the ternary value), then rounded once to fp32
// with fp32's subnormal range emulated (mpfr_check_range + mpfr_subnormalize, no double rounding).
// Every result must equal that bit for bit, for every order of the same values.
#include "src/core/exact_sum.hpp"

#include <gtest/gtest.h>
#include <mpfr.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace lockstep {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Exact sums of fp32 values span bit positions 2^-149 .. 2^160 for up to 2^31 terms.
constexpr mpfr_prec_t kExactPrec = 512;

// RN(sum of xs) in fp32, or NaN/inf by IEEE rules for non-finite inputs. An exactly zero sum of
// finite values is +0 (MPFR's RNDN sum of x and -x), the convention of exact_sum.hpp.
float mpfr_sum_f32(const std::vector<float>& xs) {
  bool nan = false, pos_inf = false, neg_inf = false;
  mpfr_t sum, r;
  mpfr_init2(sum, kExactPrec);
  mpfr_init2(r, 24);
  mpfr_set_zero(sum, 1);
  for (float x : xs) {
    if (std::isnan(x)) {
      nan = true;
    } else if (std::isinf(x)) {
      (x > 0 ? pos_inf : neg_inf) = true;
    } else {
      const int t = mpfr_add_d(sum, sum, double{x}, MPFR_RNDN);
      EXPECT_EQ(t, 0) << "MPFR sum not exact: raise kExactPrec";
    }
  }
  // Round to 24 bits first (unbounded exponent), then bring into fp32's range: the ternary value
  // lets mpfr_subnormalize round subnormals correctly instead of rounding twice.
  int t = mpfr_set(r, sum, MPFR_RNDN);
  const mpfr_exp_t old_emin = mpfr_get_emin(), old_emax = mpfr_get_emax();
  mpfr_set_emin(-148);  // 2^-149 = 0.5 * 2^-148
  mpfr_set_emax(128);   // values >= 2^128 overflow
  t = mpfr_check_range(r, t, MPFR_RNDN);
  t = mpfr_subnormalize(r, t, MPFR_RNDN);
  float out = mpfr_get_flt(r, MPFR_RNDN);
  mpfr_set_emin(old_emin);
  mpfr_set_emax(old_emax);
  mpfr_clear(sum);
  mpfr_clear(r);
  if (nan || (pos_inf && neg_inf)) return std::numeric_limits<float>::quiet_NaN();
  if (pos_inf) return kInf;
  if (neg_inf) return -kInf;
  return out;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

float super_sum(const std::vector<float>& xs) {
  SuperAccumulator acc;
  for (float x : xs) acc.add(double{x});
  return acc.round_to_float();
}

// fp32 values of both signs with exponents anywhere in [lo, hi] (subnormals included when
// lo < -126); never -0 or non-finite.
float random_f32(std::mt19937_64& rng, int lo, int hi) {
  const int e = std::uniform_int_distribution<int>(lo, hi)(rng);
  const uint32_t m = static_cast<uint32_t>(rng()) & 0x7fffffu;
  uint32_t bits = e >= -126 ? (static_cast<uint32_t>(e + 127) << 23) | m : (m | 0x800000u) >> (-126 - e);
  if (bits == 0) bits = 1;
  return std::bit_cast<float>(bits | (static_cast<uint32_t>(rng() & 1) << 31));
}

// A test set: wide spread, or clustered, with added cancellation (x, -x pairs and big + small - big).
std::vector<float> random_set(std::mt19937_64& rng, int kind) {
  const int n = std::uniform_int_distribution<int>(1, 600)(rng);
  std::vector<float> xs;
  switch (kind % 4) {
    case 0:  // every exponent, subnormals included
      for (int i = 0; i < n; ++i) xs.push_back(random_f32(rng, -149, 127));
      break;
    case 1: {  // one cluster, as chunk partials of one reduction are
      const int c = std::uniform_int_distribution<int>(-140, 120)(rng);
      for (int i = 0; i < n; ++i) xs.push_back(random_f32(rng, c - 3, c + 3));
      break;
    }
    case 2: {  // massive cancellation: the result is the few small leftovers
      for (int i = 0; i < n; ++i) {
        const float big = random_f32(rng, 60, 126);
        xs.push_back(big);
        xs.push_back(-big);
        if (i % 50 == 0) xs.push_back(random_f32(rng, -149, -100));
      }
      break;
    }
    default:  // subnormals and the smallest normals only: ties and carries at 2^-126
      for (int i = 0; i < n; ++i) xs.push_back(random_f32(rng, -160, -125));
      break;
  }
  return xs;
}

void expect_sum(const std::vector<float>& xs, float got, const char* what) {
  const float want = mpfr_sum_f32(xs);
  EXPECT_TRUE(same_bits(got, want)) << what << ": got " << got << " (0x" << std::hex
                                    << std::bit_cast<uint32_t>(got) << "), MPFR " << want << " (0x"
                                    << std::bit_cast<uint32_t>(want) << std::dec << ") over "
                                    << xs.size() << " values";
}

TEST(ExactSum, SuperAccumulatorMatchesMpfrInEveryOrder) {
  std::mt19937_64 rng(31337);
  for (int set = 0; set < 200; ++set) {
    std::vector<float> xs = random_set(rng, set);
    const float first = super_sum(xs);
    expect_sum(xs, first, "SuperAccumulator");
    for (int perm = 0; perm < 4; ++perm) {
      std::shuffle(xs.begin(), xs.end(), rng);
      EXPECT_TRUE(same_bits(super_sum(xs), first)) << "order changed the result, set " << set;
    }
  }
}

TEST(ExactSum, SuperAccumulatorMergeEqualsOneAccumulator) {
  std::mt19937_64 rng(4);
  for (int set = 0; set < 50; ++set) {
    const std::vector<float> xs = random_set(rng, set);
    SuperAccumulator a, b;
    const size_t split = xs.size() / 3;
    for (size_t i = 0; i < xs.size(); ++i) (i < split ? a : b).add(double{xs[i]});
    b.add(a);
    EXPECT_TRUE(same_bits(b.round_to_float(), super_sum(xs)));
  }
}

TEST(ExactSum, RoundingBoundaries) {
  const float kMin = std::numeric_limits<float>::denorm_min();
  const float kMax = std::numeric_limits<float>::max();
  const std::vector<std::vector<float>> cases = {
      {1.0f, std::ldexp(1.0f, -24)},                                 // tie, even stays
      {std::nextafter(1.0f, 2.0f), std::ldexp(1.0f, -24)},           // tie, odd rounds up
      {1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -70)},          // just above the tie
      {1.0f, std::ldexp(1.0f, -24), -kMin},                          // just below the tie
      {kMax, kMax},                                                  // overflow
      {kMax, kMax, -kMax},                                           // finite, whatever the order
      {kMax, std::ldexp(1.0f, 103)},                                 // tie at the overflow edge
      {kMax, std::ldexp(1.0f, 103), -kMin},                          // just below it
      {std::numeric_limits<float>::min(), -kMin},                    // normal into subnormal
      {kMin, kMin, kMin},                                            // subnormal sum
      {1e30f, kMin, -1e30f},                                         // 2^-149 survives
      {-1.0f, std::ldexp(1.0f, -24)},                                // negative tie
  };
  for (const auto& c : cases) {
    std::vector<float> xs = c;
    std::sort(xs.begin(), xs.end());
    do {
      expect_sum(xs, super_sum(xs), "SuperAccumulator");
    } while (std::next_permutation(xs.begin(), xs.end()));
  }
  // Values the accumulator accepts beyond fp32: exact double sums of fp32 values.
  SuperAccumulator acc;
  acc.add(std::ldexp(1.0, 150));  // e.g. a partial over 2^22 values near 2^128
  acc.add(-std::ldexp(1.0, 150));
  acc.add(3.0);
  EXPECT_EQ(acc.round_to_float(), 3.0f);
}

TEST(ExactSum, NonFiniteValues) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> cases = {
      {kInf, 1.0f}, {-kInf, 1.0f}, {kInf, -kInf}, {kNaN, 1.0f}, {kInf, kNaN}, {kInf, kInf, 1e-40f},
  };
  for (const auto& xs : cases) {
    expect_sum(xs, super_sum(xs), "SuperAccumulator");
    ExactAccumulator acc(1);
    for (float x : xs) acc.add(0, x);
    expect_sum(xs, acc.round(0), "ExactAccumulator");
    // The same after the element has spilled to the slow path.
    ExactAccumulator spilled(1);
    spilled.add(0, std::ldexp(1.0, 100));
    spilled.add(0, std::ldexp(1.0, -100));
    spilled.add(0, -std::ldexp(1.0, 100));
    spilled.add(0, -std::ldexp(1.0, -100));
    ASSERT_EQ(spilled.spill_count(), 1u);
    for (float x : xs) spilled.add(0, x);
    expect_sum(xs, spilled.round(0), "ExactAccumulator (spilled)");
  }
}

// add_exact agrees with MPFR on whether s + p is a double, and then adds.
TEST(ExactSum, AddExactReportsExactnessLikeMpfr) {
  std::mt19937_64 rng(17);
  mpfr_t m;
  mpfr_init2(m, 53);
  for (int i = 0; i < 200000; ++i) {
    double s = double{random_f32(rng, -149, 127)};
    if (i % 2) s += double{random_f32(rng, -149, 127)};  // a (possibly inexact) double
    const double p = double{random_f32(rng, -149, 127)};
    mpfr_set_d(m, s, MPFR_RNDN);
    const bool exact = mpfr_add_d(m, m, p, MPFR_RNDN) == 0;
    double sum = s;
    ASSERT_EQ(add_exact(sum, p), exact) << s << " + " << p;
    ASSERT_EQ(sum, exact ? mpfr_get_d(m, MPFR_RNDN) : s);
  }
  mpfr_clear(m);
}

// Per-element sums fed as fp32 values and as chunk partials (exact double sums of a few values),
// in two different orders and splits: every element rounds to RN(exact sum), spilled or not.
TEST(ExactSum, ExactAccumulatorMatchesMpfrForAnyOrderAndSplit) {
  constexpr size_t kElements = 64;
  std::mt19937_64 rng(2718);
  std::vector<std::vector<float>> values(kElements);
  for (size_t i = 0; i < kElements; ++i) values[i] = random_set(rng, static_cast<int>(i));

  auto accumulate = [&](ExactAccumulator& acc, uint64_t seed) {
    std::mt19937_64 r(seed);
    for (size_t i = 0; i < kElements; ++i) {
      std::vector<float> xs = values[i];
      std::shuffle(xs.begin(), xs.end(), r);
      size_t k = 0;
      while (k < xs.size()) {
        // A chunk partial: the double sum of up to 4 values while it stays exact.
        const size_t len = std::min<size_t>(xs.size() - k, 1 + r() % 4);
        double partial = 0.0;
        size_t used = 0;
        while (used < len && add_exact(partial, double{xs[k + used]})) ++used;
        if (used == 0) {
          acc.add(i, double{xs[k]});
          used = 1;
        } else {
          acc.add(i, partial);
        }
        k += used;
      }
    }
  };
  ExactAccumulator a(kElements), b(kElements);
  accumulate(a, 1);
  accumulate(b, 2);
  EXPECT_GT(a.spill_count(), 0u) << "the wide-spread sets should need the slow path";
  std::vector<float> out_a(kElements), out_b(kElements);
  a.round_to(out_a.data());
  b.round_to(out_b.data());
  for (size_t i = 0; i < kElements; ++i) {
    expect_sum(values[i], out_a[i], "ExactAccumulator");
    EXPECT_TRUE(same_bits(out_a[i], out_b[i])) << "element " << i;
  }
  a.zero();
  EXPECT_EQ(a.spill_count(), 0u);
  EXPECT_EQ(a.round(0), 0.0f);
}

// add_run over runs of any length and position gives the elementwise add()'s state: the same
// doubles, the same spills (the wide-spread sets need them; an inf and a NaN take the slow path),
// the same rounded sums, also over a sub-range (round_to(first, end)).
TEST(ExactSum, AddRunEqualsElementwiseAdd) {
  constexpr size_t kElements = 64;
  std::mt19937_64 rng(1414);
  std::vector<std::vector<float>> values(kElements);
  size_t rounds = 0;
  for (size_t i = 0; i < kElements; ++i) {
    values[i] = random_set(rng, static_cast<int>(i));
    rounds = std::max(rounds, values[i].size());
  }
  values[5].push_back(std::numeric_limits<float>::infinity());
  values[9].push_back(std::numeric_limits<float>::quiet_NaN());
  rounds = std::max({rounds, values[5].size(), values[9].size()});
  ExactAccumulator by_run(kElements), by_element(kElements);
  std::vector<float> p(kElements);
  for (size_t round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < kElements; ++i) p[i] = round < values[i].size() ? values[i][round] : 0.0f;
    for (size_t i0 = 0; i0 < kElements;) {
      const size_t n = std::min<size_t>(kElements - i0, 1 + rng() % 40);
      by_run.add_run(i0, p.data() + i0, n);
      for (size_t k = 0; k < n; ++k) by_element.add(i0 + k, p[i0 + k]);
      i0 += n;
    }
  }
  EXPECT_GT(by_run.spill_count(), 0u) << "the wide-spread sets should need the slow path";
  EXPECT_EQ(by_run.spill_count(), by_element.spill_count());
  std::vector<float> run_out(kElements), element_out(kElements), part(kElements);
  by_run.round_to(run_out.data());
  by_element.round_to(element_out.data());
  by_run.round_to(3, 41, part.data());
  for (size_t i = 0; i < kElements; ++i) {
    EXPECT_EQ(by_run.spilled(i), by_element.spilled(i)) << "element " << i;
    if (!by_run.spilled(i)) {
      EXPECT_EQ(std::bit_cast<uint64_t>(by_run.partial_sums()[i]),
                std::bit_cast<uint64_t>(by_element.partial_sums()[i]))
          << "element " << i;
    }
    EXPECT_TRUE(same_bits(run_out[i], element_out[i])) << "element " << i;
    EXPECT_TRUE(same_bits(run_out[i], by_run.round(i))) << "element " << i;
    if (i >= 3 && i < 41) {
      EXPECT_TRUE(same_bits(part[i - 3], run_out[i])) << "element " << i;
    }
  }
  EXPECT_TRUE(std::isinf(run_out[5]));
  EXPECT_TRUE(std::isnan(run_out[9]));
}

// The read access of a data-parallel reduction: each "rank" accumulates its share of every
// element; a receiver rebuilt from partial_sums() where not spilled and from spill()'s digits and
// flags where spilled (add(i, SuperAccumulator)) rounds to MPFR's sum of all the values.
TEST(ExactSum, ExactAccumulatorReadAccessRebuildsTheSumsOfSeveralAccumulators) {
  constexpr size_t kElements = 64, kRanks = 3;
  std::mt19937_64 rng(4242);
  std::vector<std::vector<float>> values(kElements);
  for (size_t i = 0; i < kElements; ++i) values[i] = random_set(rng, static_cast<int>(i));
  std::vector<ExactAccumulator> ranks(kRanks);
  for (ExactAccumulator& acc : ranks) acc.reset(kElements);
  for (size_t i = 0; i < kElements; ++i) {
    for (size_t k = 0; k < values[i].size(); ++k) ranks[k % kRanks].add(i, double{values[i][k]});
  }
  ExactAccumulator total(kElements);
  size_t spilled = 0;
  for (const ExactAccumulator& acc : ranks) {
    size_t mine = 0;
    for (size_t i = 0; i < kElements; ++i) {
      if (acc.spilled(i)) {
        ++mine;
        const SuperAccumulator& s = acc.spill(i);
        EXPECT_TRUE(same_bits(s.round_to_float(), acc.round(i))) << "element " << i;
        total.add(i, SuperAccumulator::from_digits(s.digits(), s.flags()));
      } else {
        EXPECT_TRUE(same_bits(static_cast<float>(acc.partial_sums()[i]), acc.round(i))) << "element " << i;
        total.add(i, acc.partial_sums()[i]);
      }
    }
    EXPECT_EQ(mine, acc.spill_count());
    spilled += mine;
  }
  EXPECT_GT(spilled, 0u) << "the wide-spread sets should need the slow path";
  for (size_t i = 0; i < kElements; ++i) expect_sum(values[i], total.round(i), "rebuilt ExactAccumulator");
}

// from_digits() of digits() and flags() is the same accumulator: same value, same non-finite state.
TEST(ExactSum, SuperAccumulatorFromDigitsKeepsValueAndFlags) {
  std::mt19937_64 rng(99);
  for (int set = 0; set < 40; ++set) {
    const std::vector<float> xs = random_set(rng, set);
    SuperAccumulator a;
    for (float x : xs) a.add(double{x});
    const SuperAccumulator b = SuperAccumulator::from_digits(a.digits(), a.flags());
    EXPECT_EQ(b.flags(), 0);
    EXPECT_TRUE(same_bits(b.round_to_float(), a.round_to_float())) << "set " << set;
  }
  for (const std::vector<float>& xs : std::vector<std::vector<float>>{
           {1.0f, kInf}, {-kInf, 2.0f}, {kInf, -kInf}, {std::numeric_limits<float>::quiet_NaN(), 3.0f}}) {
    SuperAccumulator a;
    for (float x : xs) a.add(double{x});
    const SuperAccumulator b = SuperAccumulator::from_digits(a.digits(), a.flags());
    EXPECT_EQ(b.flags(), a.flags());
    EXPECT_TRUE(same_bits(b.round_to_float(), mpfr_sum_f32(xs)));
  }
}

// add(i, SuperAccumulator) spills the element, keeping the double it held.
TEST(ExactSum, AddingASuperAccumulatorSpillsTheElement) {
  ExactAccumulator acc(2);
  acc.add(0, 1.0);
  acc.add(1, 1.0);
  EXPECT_FALSE(acc.spilled(0));
  EXPECT_EQ(acc.partial_sums()[0], 1.0);
  SuperAccumulator tiny;
  tiny.add(std::ldexp(1.0, -149));
  tiny.add(std::ldexp(1.0, -149));
  acc.add(0, tiny);
  EXPECT_TRUE(acc.spilled(0));
  EXPECT_FALSE(acc.spilled(1));
  EXPECT_EQ(acc.spill_count(), 1u);
  acc.add(0, -1.0);
  EXPECT_EQ(acc.round(0), std::ldexp(1.0f, -148));
  EXPECT_EQ(acc.spill(0).round_to_float(), std::ldexp(1.0f, -148));
}

// Zero sums are +0 in every path (the IEEE RN sum of x and -x), even of negative zeros.
TEST(ExactSum, ZeroSumIsPositiveZero) {
  const std::vector<float> xs = {-0.0f, -0.0f};
  EXPECT_FALSE(std::signbit(super_sum(xs)));
  ExactAccumulator acc(1);
  for (float x : xs) acc.add(0, x);
  EXPECT_FALSE(std::signbit(acc.round(0)));
}

// Property: any finite fp32 values (from raw bit patterns) sum to MPFR's RN sum, in either order.
RC_GTEST_PROP(ExactSum, SuperAccumulatorIsExactForAnyBits, (const std::vector<uint32_t>& bits)) {
  std::vector<float> xs;
  for (uint32_t b : bits) {
    const float x = std::bit_cast<float>(b);
    if (std::isfinite(x) && x != 0.0f) xs.push_back(x);
  }
  const float got = super_sum(xs);
  RC_ASSERT(same_bits(got, mpfr_sum_f32(xs)));
  std::reverse(xs.begin(), xs.end());
  RC_ASSERT(same_bits(super_sum(xs), got));
}

}  // namespace
}  // namespace lockstep
