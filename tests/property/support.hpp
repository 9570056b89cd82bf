// Shared pieces of the RapidCheck kernel properties (tests/property/*.cpp): value and shape
// generators (ordinary dyadic values, ±0, subnormals, values near the overflow threshold), the
// within-bound check against a Bounded<T> reference (with fp32 overflow handled rigorously), the
// bitwise check, the NaN/Inf pattern check, and a per-check tightness table printed at exit.
//
// Every failure goes through RC_FAIL, so RapidCheck shrinks the generated shapes and values to a
// minimal case and prints them together with the failing check's first mismatches.
// Not here: the canonical scalar specification of each op (spec.hpp) and anything from
// tests/unit (those helpers may move; this binary keeps its own).
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <boost/multiprecision/mpfr.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "reference/bounded.hpp"
#include "verify/core/bounds.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::prop {

// The two reference scalar types. Bounded<Mpfr64> is rigorous end to end (64-bit MPFR values are
// correctly rounded, 2^-40 below the fp32 bounds they carry); Bounded<double> is used where MPFR
// is too slow for 100 cases, its value being off by ~2^-53 relative, 2^-29 of the fp32 bound.
using Mpfr64 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<64>,
                                             boost::multiprecision::et_off>;
using BM = reference::Bounded<Mpfr64>;
using BD = reference::Bounded<double>;

inline float float_of_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Generators.

// What kinds of values an op's inputs may hold. `big_exp` is the binary exponent of the largest
// magnitudes generated (values in [2^(big_exp-1), 2^big_exp)); ops choose it so that the derived
// bounds stay meaningful (a reduction's Σ|terms| must stay below FLT_MAX, where the running error
// analysis holds). `scale_exp` spreads ordinary values over binades [2^-scale_exp, 2^scale_exp].
struct ValueKinds {
  int scale_exp = 3;
  bool zeros = true;
  bool subnormals = true;
  int big_exp = 0;  // 0: no large values
};

// One fp32 value: mostly dyadic m·2^(e−20) with |m| <= 2^20, sometimes ±0, a subnormal, or a
// large value. Shrinks towards small mantissas (and so towards 0).
inline rc::Gen<float> gen_value(ValueKinds k = {}) {
  auto ordinary = rc::gen::map(
      rc::gen::pair(rc::gen::inRange<int32_t>(-(1 << 20), (1 << 20) + 1),
                    rc::gen::inRange<int32_t>(-k.scale_exp, k.scale_exp + 1)),
      [](std::pair<int32_t, int32_t> p) {
        return std::ldexp(static_cast<float>(p.first), p.second - 20);
      });
  auto zero = rc::gen::element(0.0f, -0.0f);
  auto subnormal = rc::gen::map(
      rc::gen::pair(rc::gen::inRange<uint32_t>(1, 0x800000u), rc::gen::arbitrary<bool>()),
      [](std::pair<uint32_t, bool> p) { return float_of_bits(p.first | (p.second ? 0x80000000u : 0u)); });
  const int big = k.big_exp;
  auto large = rc::gen::map(
      rc::gen::pair(rc::gen::inRange<uint32_t>(0, 0x800000u), rc::gen::arbitrary<bool>()),
      [big](std::pair<uint32_t, bool> p) {
        const float m = float_of_bits(0x3f800000u | p.first);  // [1, 2)
        return std::ldexp(p.second ? -m : m, big - 1);
      });
  return rc::gen::weightedOneOf<float>({{40, ordinary},
                                         {k.zeros ? 2u : 0u, zero},
                                         {k.subnormals ? 2u : 0u, subnormal},
                                         {k.big_exp > 0 ? 2u : 0u, large}});
}

inline std::vector<float> gen_values(int64_t n, ValueKinds k = {}) {
  return *rc::gen::container<std::vector<float>>(static_cast<size_t>(n), gen_value(k));
}

// A dimension: 1, a small prime, or anything in [1, hi] (odd sizes included).
inline int64_t gen_dim(int64_t hi) {
  std::vector<int64_t> special{1};
  for (int64_t p : {2, 3, 5, 7, 11, 13, 31, 61, 67, 127}) {
    if (p <= hi) special.push_back(p);
  }
  return *rc::gen::weightedOneOf<int64_t>(
      {{1, rc::gen::elementOf(special)}, {2, rc::gen::inRange<int64_t>(1, hi + 1)}});
}

// ---------------------------------------------------------------------------------------------
// Tightness table: per check, the number of checked cases and the worst err/bound observed,
// printed when the test binary ends (docs/numerics.md: report tightness next to every check).

class TightnessTable : public ::testing::Environment {
 public:
  static TightnessTable& get() {
    static TightnessTable* t = [] {
      auto* p = new TightnessTable;
      ::testing::AddGlobalTestEnvironment(p);  // gtest owns it
      return p;
    }();
    return *t;
  }
  void note(const std::string& what, double tightness, int64_t vacuous = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& row = rows_[what];
    ++row.cases;
    row.vacuous += vacuous;
    if (tightness > row.tightness) row.tightness = tightness;
  }
  void TearDown() override {
    if (rows_.empty()) return;
    std::cout << "property check                                  cases  max err/bound  vacuous elements\n";
    for (const auto& [what, row] : rows_) {
      std::cout << "  " << what << std::string(what.size() < 46 ? 46 - what.size() : 1, ' ')
                << row.cases << "  " << row.tightness << "  " << row.vacuous << "\n";
    }
  }

 private:
  std::mutex mutex_;
  struct Row {
    int64_t cases = 0, vacuous = 0;
    double tightness = 0;
  };
  std::map<std::string, Row> rows_;
};
// Registered with gtest during static initialisation, before RUN_ALL_TESTS.
inline const bool kTightnessTableRegistered = (TightnessTable::get(), true);

// ---------------------------------------------------------------------------------------------
// Checks.

// Smallest magnitude that rounds to infinity in fp32 under round-to-nearest-even:
// FLT_MAX + half an ulp of FLT_MAX = 2^128 − 2^103.
inline constexpr double kF32OverflowThreshold = 0x1.ffffffp127;

template <class T>
double to_double(const T& x) {
  return static_cast<double>(x);
}

// got[i] must lie within want[i].err of want[i].value. Where the reference interval lies wholly
// at or beyond the fp32 overflow threshold the kernel must return the infinity of that sign;
// where it straddles the threshold, that infinity is accepted too. Non-finite reference values
// must be matched exactly (NaN by NaN). A NaN bound (Bounded's 0·inf where an operand's bound is
// already infinite) is vacuous: it is read as +inf and counted in the table's "vacuous" column.
// `what` names the check (tightness table), `where` the case.
template <class T>
void check_within(const std::string& what, const std::string& where, const float* got,
                  const reference::Bounded<T>* want, int64_t n) {
  std::vector<double> value(static_cast<size_t>(n)), bound(static_cast<size_t>(n));
  int64_t vacuous = 0;
  for (int64_t i = 0; i < n; ++i) {
    double w = to_double(want[i].value);
    double b = to_double(want[i].err);
    if (std::isnan(b) || b == INFINITY) {
      b = INFINITY;
      ++vacuous;
    }
    if (std::isfinite(w)) {
      const double inf = w > 0 ? INFINITY : -INFINITY;
      if (std::fabs(w) - b >= kF32OverflowThreshold) {
        w = inf;                                   // must overflow
      } else if (std::fabs(w) + b >= kF32OverflowThreshold && got[i] == inf) {
        w = inf;                                   // may overflow
      }
    }
    value[i] = w;
    bound[i] = b;
  }
  const auto r = verify::compare_within(got, value.data(), bound.data(), n);
  TightnessTable::get().note(what, r.max_tightness, vacuous);
  if (!r.ok()) RC_FAIL(r.summary(what + " [" + where + "]"));
}

template <class T>
void check_within(const std::string& what, const std::string& where,
                  const std::vector<float>& got, const std::vector<reference::Bounded<T>>& want) {
  RC_ASSERT(got.size() == want.size());
  check_within(what, where, got.data(), want.data(), static_cast<int64_t>(got.size()));
}

// Bitwise equality (NaN matches any NaN: the project's NaN policy for bitwise checks).
inline void check_bitwise(const std::string& what, const std::string& where,
                          const std::vector<float>& got, const std::vector<float>& want) {
  RC_ASSERT(got.size() == want.size());
  const auto r = verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(got.size()));
  if (!r.ok()) RC_FAIL(r.summary(what + " bitwise [" + where + "]"));
}

// The class of every element (NaN, +inf, −inf, finite) must match the reference's: NaN and Inf
// propagate exactly as the formulas say, and nowhere else.
inline void check_nonfinite_pattern(const std::string& what, const std::string& where,
                                    const std::vector<float>& got, const std::vector<double>& want) {
  RC_ASSERT(got.size() == want.size());
  auto cls = [](double x) { return std::isnan(x) ? 0 : (x == INFINITY ? 1 : (x == -INFINITY ? 2 : 3)); };
  for (size_t i = 0; i < got.size(); ++i) {
    if (cls(got[i]) != cls(want[i])) {
      std::ostringstream os;
      os << what << " NaN/Inf pattern [" << where << "]: element " << i << " got " << got[i]
         << ", reference " << want[i];
      RC_FAIL(os.str());
    }
  }
}

template <class T>
std::vector<reference::Bounded<T>> bounded(const std::vector<float>& x) {
  std::vector<reference::Bounded<T>> r;
  r.reserve(x.size());
  for (float v : x) r.emplace_back(T(static_cast<double>(v)));
  return r;
}

inline std::vector<double> doubles(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

template <class T>
std::vector<double> values_of(const std::vector<reference::Bounded<T>>& x) {
  std::vector<double> r;
  r.reserve(x.size());
  for (const auto& v : x) r.push_back(to_double(v.value));
  return r;
}

// A copy of x with one element (index chosen by the generator) replaced by a non-finite value.
inline std::vector<float> with_nonfinite(std::vector<float> x, int64_t* where = nullptr) {
  const auto i = *rc::gen::inRange<size_t>(0, x.size());
  x[i] = *rc::gen::element(NAN, INFINITY, -INFINITY);
  if (where != nullptr) *where = static_cast<int64_t>(i);
  return x;
}

inline std::string shape_str(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, v] : dims) {
    os << (first ? "" : " ") << name << "=" << v;
    first = false;
  }
  return os.str();
}

}  // namespace lockstep::prop
