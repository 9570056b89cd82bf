// Deterministic double-precision log and cos for host-side set-up values (initialisation,
// learning-rate schedules): only IEEE +,-,*,/ and exact exponent manipulation, evaluated in a
// fixed order, so the results are the same bits on every machine and libm. Accuracy: a few ulp of
// double, far finer than the fp32 values they feed. Not for kernels (kernels/ops/transcendental.hpp).
#pragma once

#include <cmath>

namespace lockstep::det {

inline constexpr double kPi = 3.14159265358979323846;
inline constexpr double kLn2 = 0.69314718055994530942;

// Natural log for x > 0 (NaN otherwise): x = m·2^e with m in [√½, √2), log m = 2·atanh(f),
// f = (m−1)/(m+1), |f| <= 0.1716, series summed to f^31 (remainder < 1e-24).
inline double log(double x) {
  if (!(x > 0) || std::isinf(x)) return x == 0 ? -INFINITY : (x > 0 ? x : NAN);
  int e = 0;
  double m = std::frexp(x, &e);  // exact
  if (m < 0.70710678118654752440) {
    m *= 2;
    e -= 1;
  }
  const double f = (m - 1) / (m + 1);
  const double f2 = f * f;
  double series = 0;
  for (int k = 31; k >= 1; k -= 2) series = series * f2 + 1.0 / k;  // Horner in f²
  return e * kLn2 + 2 * f * series;
}

// cos(x) for any finite x: reduced to [0, π/2] by the symmetries of cos (the reduction by 2π is
// only exact-ish for large |x|, which set-up code never passes), then Taylor to x^28.
inline double cos(double x) {
  x = std::fabs(x);
  x = std::fmod(x, 2 * kPi);  // fmod is exact
  if (x > kPi) x = 2 * kPi - x;
  double sign = 1;
  if (x > kPi / 2) {
    x = kPi - x;
    sign = -1;
  }
  const double x2 = x * x;
  double term = 1, sum = 1;
  for (int k = 1; k <= 14; ++k) {
    term = -term * x2 / ((2 * k - 1) * (2 * k));
    sum += term;
  }
  return sign * sum;
}

}  // namespace lockstep::det
