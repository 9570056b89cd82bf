// Deterministic double-precision exp, log, cos and sin for set-up values (RoPE tables,
// initialisation, learning-rate schedules): range reduction plus fixed polynomials using only
// IEEE +, −, ×, ÷ and exponent-bit manipulation, no fma, no libm, so the same bits on every
// machine (libm's results differ between versions, and a set-up value that differs by one ulp
// changes every step after it). Accuracy: a few ulp of double (checked against MPFR by the RoPE
// table tests). Not for kernels' inner loops (kernels/ops/transcendental.hpp is the fp32 set).
#pragma once

#include <cstdint>
#include <cstring>

namespace lockstep::det {

inline constexpr double kPi = 3.14159265358979323846;
// Angles up to this many radians keep k·(π/2)_hi exact in cos_sin's reduction (k < 2^20).
inline constexpr double kMaxAngle = 0x1p20;

namespace detail {

inline double pow2i(int64_t k) {  // 2^k for k in [-1022, 1023], from the exponent bits
  const uint64_t b = static_cast<uint64_t>(k + 1023) << 52;
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Round to the nearest integer (ties to even) for |x| < 2^51.
inline double round_to_int(double x) {
  constexpr double kShift = 0x1.8p52;
  return (x + kShift) - kShift;
}

// 1/n! in double: n! is exact in double up to 18!, the division rounds once.
constexpr double inv_factorial(int n) {
  double f = 1;
  for (int i = 2; i <= n; ++i) f *= i;
  return 1.0 / f;
}

}  // namespace detail

// e^x for |x| < 700: x = k·ln2 + r, |r| <= ln2/2, ln2 split so that k·ln2_hi is exact; e^r by
// its Taylor polynomial to r^13 (truncation < 1e-17 relative).
inline double exp(double x) {
  constexpr double kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  const double k = detail::round_to_int(x * 0x1.71547652b82fep+0);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = detail::inv_factorial(13);
  for (int n = 12; n >= 0; --n) p = p * r + detail::inv_factorial(n);
  return p * detail::pow2i(static_cast<int64_t>(k));
}

// log x for finite normal x > 0: x = m·2^e, m in [√½, √2), log m = 2·atanh(f), f = (m−1)/(m+1),
// |f| <= 0.172, series to f^25 (truncation < 1e-19).
inline double log(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  int64_t e = static_cast<int64_t>((b >> 52) & 0x7ff) - 1023;
  b = (b & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52);  // m in [1, 2)
  double m;
  std::memcpy(&m, &b, sizeof m);
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    e += 1;
  }
  const double f = (m - 1) / (m + 1);
  const double f2 = f * f;
  double series = 1.0 / 25;
  for (int k = 23; k >= 1; k -= 2) series = series * f2 + 1.0 / k;
  return static_cast<double>(e) * 0x1.62e42fefa39efp-1 + 2 * f * series;
}

// cos and sin of a in [0, kMaxAngle]: a = k·π/2 + r with π/2 in three pieces (the first two of
// 33 bits, so k·piece is exact and a − k·P1 is exact by Sterbenz), |r| <= π/4; Taylor polynomials
// to r^18 / r^17 (truncation < 1e-17), then the quadrant k mod 4 picks signs and roles.
inline void cos_sin(double a, double* c, double* s) {
  using detail::inv_factorial;
  constexpr double kP1 = 0x1.921fb544p+0, kP2 = 0x1.0b4611a6p-34, kP3 = 0x1.3198a2e037073p-69;
  const double k = detail::round_to_int(a * 0x1.45f306dc9c883p-1);
  const double r = ((a - k * kP1) - k * kP2) - k * kP3;
  const double z = r * r;
  double sp = inv_factorial(17), cp = -inv_factorial(18);  // signs of r^17, r^18
  for (int n = 15; n >= 3; n -= 2) sp = sp * z + ((n / 2) % 2 ? -inv_factorial(n) : inv_factorial(n));
  for (int n = 16; n >= 2; n -= 2) cp = cp * z + ((n / 2) % 2 ? -inv_factorial(n) : inv_factorial(n));
  const double sr = r + r * z * sp;
  const double cr = 1.0 + z * cp;
  switch (static_cast<int64_t>(k) & 3) {
    case 0: *c = cr; *s = sr; break;
    case 1: *c = -sr; *s = cr; break;
    case 2: *c = -cr; *s = -sr; break;
    default: *c = sr; *s = -cr; break;
  }
}

inline double cos(double a) {
  double c, s;
  cos_sin(a < 0 ? -a : a, &c, &s);
  return c;
}

}  // namespace lockstep::det
