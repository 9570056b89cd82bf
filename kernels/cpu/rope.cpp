// Rotary position embedding (RoPE) on the CPU: tables, forward and backward (contract in
// kernels/ops/attention.hpp). No reductions, so there is one mode.
//
// Tables: inv_freq_i = theta^(-2i/HS) = exp(−(2i/HS)·log theta) and angle = t·inv_freq_i in
// double, then cos/sin of the angle, rounded once to fp32. exp, log, sin and cos are this file's
// own (libm's differ between versions, and a table entry that differs by one ulp changes every
// step after it): range reduction plus fixed polynomials in IEEE double, no fma, so the same bits
// everywhere. Accuracy of the double values: a few ulp of double in exp/log/sin/cos, the angle
// off by at most ~T·2^-50 absolute; the fp32 tables are therefore within one fp32 rounding
// (u·|value|) plus T·2^-49 of the exact cos/sin(t·theta^(-2i/HS)) — checked against MPFR by
// tests/unit/kernels_attention.
//
// Rotation of each pair (x, y) = (p[i], p[i + HS/2]) in fp32, no fma, products rounded first:
//   x' = (x·c) − (y·s),  y' = (x·s) + (y·c)
// and backward, the transpose:  dx = (dx'·c) + (dy'·s),  dy = (dy'·c) − (dx'·s).
//
// Not here: attention itself (attention.cpp); NTK/YaRN-style frequency scaling.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops/attention.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

// Angles up to this many radians keep k·(π/2)_hi exact in the reduction below (k < 2^20).
constexpr double kMaxAngle = 0x1p20;

double pow2i(int64_t k) {  // 2^k for k in [-1022, 1023], from the exponent bits
  const uint64_t b = static_cast<uint64_t>(k + 1023) << 52;
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Round to the nearest integer (ties to even) for |x| < 2^51.
double round_to_int(double x) {
  constexpr double kShift = 0x1.8p52;
  return (x + kShift) - kShift;
}

// 1/n! in double: n! is exact in double up to 18!, the division rounds once.
constexpr double inv_factorial(int n) {
  double f = 1;
  for (int i = 2; i <= n; ++i) f *= i;
  return 1.0 / f;
}

// e^x for |x| < 700: x = k·ln2 + r, |r| <= ln2/2, ln2 split so that k·ln2_hi is exact; e^r by
// its Taylor polynomial to r^13 (truncation < 1e-17 relative).
double rope_exp(double x) {
  constexpr double kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  const double k = round_to_int(x * 0x1.71547652b82fep+0);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = inv_factorial(13);
  for (int n = 12; n >= 0; --n) p = p * r + inv_factorial(n);
  return p * pow2i(static_cast<int64_t>(k));
}

// log x for finite x > 0: x = m·2^e, m in [√½, √2), log m = 2·atanh(f), f = (m−1)/(m+1),
// |f| <= 0.172, series to f^25 (truncation < 1e-19).
double rope_log(double x) {
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
void rope_cos_sin(double a, double* c, double* s) {
  constexpr double kP1 = 0x1.921fb544p+0, kP2 = 0x1.0b4611a6p-34, kP3 = 0x1.3198a2e037073p-69;
  const double k = round_to_int(a * 0x1.45f306dc9c883p-1);
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

void check_rope_shape(AttentionShape s, const char* op) {
  LS_REQUIRE(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, op,
             ": B, T, NH, NKV, HS must be positive (got B=", s.B, " T=", s.T, " NH=", s.NH,
             " NKV=", s.NKV, " HS=", s.HS, ")");
  LS_REQUIRE(s.HS % 2 == 0, op, ": RoPE needs an even head size (HS=", s.HS, ")");
}

// Applies the rotation, or its transpose, to the q and k heads of every row (v is untouched).
void rotate(AttentionShape s, float* p, const float* cos_table, const float* sin_table,
            bool transpose) {
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS, half = s.HS / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t t = 0; t < s.T; ++t) {
      const float* cs = cos_table + t * half;
      const float* sn = sin_table + t * half;
      for (int64_t head = 0; head < s.NH + s.NKV; ++head) {  // q heads then k heads
        float* x = p + (b * s.T + t) * row + head * s.HS;
        float* y = x + half;
        for (int64_t i = 0; i < half; ++i) {
          const float xi = x[i], yi = y[i], c = cs[i], sv = sn[i];
          if (!transpose) {
            x[i] = xi * c - yi * sv;
            y[i] = xi * sv + yi * c;
          } else {
            // forward: x' = x·c − y·s, y' = x·s + y·c  =>  dx = dx'·c + dy'·s, dy = dy'·c − dx'·s
            x[i] = xi * c + yi * sv;
            y[i] = yi * c - xi * sv;
          }
        }
      }
    }
  }
}

}  // namespace

void rope_tables(int64_t T, int64_t HS, double theta, float* cos_table, float* sin_table) {
  LS_REQUIRE(T > 0 && HS > 0 && HS % 2 == 0, "rope_tables: T must be positive and HS even (T=", T,
             " HS=", HS, ")");
  LS_REQUIRE(theta > 1 && std::isfinite(theta), "rope_tables: theta must be finite and > 1 (got ",
             theta, ")");
  LS_REQUIRE(static_cast<double>(T) <= kMaxAngle, "rope_tables: T (", T, ") above ", kMaxAngle,
             " positions is not supported by the angle reduction");
  const int64_t half = HS / 2;
  const double log_theta = rope_log(theta);
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = rope_exp(-(static_cast<double>(2 * i) / static_cast<double>(HS)) * log_theta);
    for (int64_t t = 0; t < T; ++t) {
      double c, sn;
      rope_cos_sin(static_cast<double>(t) * inv_freq, &c, &sn);
      cos_table[t * half + i] = static_cast<float>(c);
      sin_table[t * half + i] = static_cast<float>(sn);
    }
  }
}

void rope_forward(AttentionShape s, float* qkv, const float* cos_table, const float* sin_table) {
  check_rope_shape(s, "rope_forward");
  rotate(s, qkv, cos_table, sin_table, /*transpose=*/false);
}

void rope_backward(AttentionShape s, float* dqkv, const float* cos_table, const float* sin_table) {
  check_rope_shape(s, "rope_backward");
  rotate(s, dqkv, cos_table, sin_table, /*transpose=*/true);
}

}  // namespace lockstep::cpu
