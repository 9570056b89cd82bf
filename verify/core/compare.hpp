// Comparators: bitwise, ulp distance, and within a derived bound (with tightness).
//
// docs/numerics.md, "Comparing numbers": a failure reports the max error in ulps and as a fraction of the
// bound, and the first mismatches with their indices. Tolerances always come from bounds.hpp or a
// Bounded<T> reference, never from a literal.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::verify {

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Distance in units in the last place between two fp32 values, counting across zero
// (+0 and -0 are 0 apart); NaN against anything else is UINT64_MAX.
inline uint64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return (std::isnan(a) && std::isnan(b)) ? 0 : UINT64_MAX;
  auto ordered = [](float x) -> int64_t {  // monotone map of floats onto integers
    const int64_t u = float_bits(x);
    return (u & 0x80000000u) ? -(u & 0x7fffffff) : u;
  };
  const int64_t d = ordered(a) - ordered(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

struct Mismatch {
  int64_t index;
  double got, want, bound;
};

struct CompareReport {
  int64_t count = 0;
  int64_t mismatches = 0;
  double max_abs_err = 0;
  double max_bound = 0;        // largest bound seen (0 in exact mode)
  double max_tightness = 0;    // max over elements of err / bound (0 when err == 0)
  uint64_t max_ulp = 0;
  int64_t worst_index = -1;
  std::vector<Mismatch> first;  // up to 5

  bool ok() const { return mismatches == 0; }

  std::string summary(const std::string& what) const {
    std::ostringstream os;
    os << what << ": " << (ok() ? "ok" : "FAILED") << ", " << mismatches << "/" << count
       << " mismatching, max |err| " << max_abs_err << ", max ulp " << max_ulp;
    if (max_bound > 0) os << ", max tightness (err/bound) " << max_tightness;
    for (const auto& m : first) {
      os << "\n  [" << m.index << "] got " << m.got << " want " << m.want;
      if (m.bound > 0 || m.bound != m.bound) os << " bound " << m.bound;
    }
    return os.str();
  }

  void note(int64_t i, double got, double want, double err, double bound, bool bad, uint64_t ulp) {
    ++count;
    if (ulp > max_ulp) max_ulp = ulp;
    if (bound > max_bound) max_bound = bound;
    const double t = err == 0 ? 0 : (bound > 0 ? err / bound : INFINITY);
    if (err > max_abs_err || worst_index < 0) {
      max_abs_err = err;
      worst_index = i;
    }
    if (t > max_tightness) max_tightness = t;
    if (bad) {
      ++mismatches;
      if (first.size() < 5) first.push_back({i, got, want, bound});
    }
  }
};

// Bitwise equality; two NaNs count as equal (any payload), which is the NaN policy of every
// bitwise check in Lockstep.
inline CompareReport compare_exact(const float* got, const float* want, int64_t n) {
  CompareReport r;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = float_bits(got[i]) == float_bits(want[i]) ||
                      (std::isnan(got[i]) && std::isnan(want[i]));
    const double err = same ? 0.0 : std::fabs(double(got[i]) - double(want[i]));
    r.note(i, got[i], want[i], err, 0.0, !same, ulp_distance(got[i], want[i]));
  }
  return r;
}

// |got − want| <= bound elementwise (want and bound from a Bounded reference). NaN or inf in
// `want` must be matched exactly by `got`.
inline CompareReport compare_within(const float* got, const double* want, const double* bound,
                                    int64_t n) {
  CompareReport r;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i], b = bound[i];
    double err;
    bool bad;
    if (!std::isfinite(w) || !std::isfinite(g)) {
      const bool same = (std::isnan(w) && std::isnan(g)) || g == w;
      err = same ? 0.0 : INFINITY;
      bad = !same;
    } else {
      err = std::fabs(g - w);
      bad = !(err <= b);
    }
    r.note(i, g, w, err, b, bad, ulp_distance(got[i], static_cast<float>(w)));
  }
  return r;
}

}  // namespace lockstep::verify
