// The project's own fp32 exp, log and tanh for canonical mode.
//
// libm's expf/logf/tanhf differ between glibc versions, and from CUDA's; canonical mode needs the
// same bits on every machine, so it uses these instead. Each is range reduction plus a fixed
// polynomial, evaluated in fp32 with every fused multiply-add written out as std::fma (the build
// uses -ffp-contract=off / --fmad=false, so nothing else is fused) and every power of two built
// from exponent bits, not libm. Nothing depends on rounding mode tricks beyond round-to-nearest-even,
// which is the default on every device Lockstep runs on; subnormals are kept (no flush-to-zero).
// The code is branch-light (selects, not early returns) so that a compiler can vectorise a loop
// of calls without changing a single bit: SIMD lanes run the same operations as the scalar code.
//
// Accuracy, relative to the exact value, u = 2^-24 (half an ulp at the bottom of a binade):
//               a priori (the analysis next to each function)   measured max (MPFR, see below)
//   ls_expf     < 2u (+ 2^-150 absolute for subnormal results)  1.19u
//   ls_logf     < 2.5u                                          1.26u
//   ls_tanhf    < 3u                                            1.40u
// all within reference::bounded_format().transcendental_units·u = 4u (2 ulp), the figure the
// Bounded reference charges every exp/log/tanh. tests/unit/kernels_attention/test_transcendental.cpp
// checks that bound against MPFR on every 64th fp32 bit pattern where the polynomials see all
// their reduced arguments, sparser samples of the whole line, and the special values.
//
// Special values: exp(NaN)=NaN, exp(+inf)=+inf, exp(-inf)=+0, exp(x)=+inf for x above
// ln(FLT_MAX)'s neighbourhood (rounding decides the last few values) and +0 below
// ln(2^-150); log(NaN or x<0)=NaN, log(±0)=-inf, log(+inf)=+inf; tanh(±0)=±0, tanh(±inf)=±1,
// tanh(NaN)=NaN.
//
// Not here: erf (GELU's erf form) and anything in double; the reference's transcendentals are
// Real-typed (reference/bounded.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "src/core/host_device.hpp"

namespace lockstep {

namespace transcendental_detail {

LS_HOST_DEVICE inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
LS_HOST_DEVICE inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
// 2^k for k in [-126, 127], exactly, from the exponent field.
LS_HOST_DEVICE inline float pow2i(int32_t k) {
  return float_of(static_cast<uint32_t>(k + 127) << 23);
}
// Round to the nearest integer (ties to even) for |x| < 2^22, by the 1.5·2^23 shift: adding it
// pushes the fraction bits out of the significand under round-to-nearest-even.
LS_HOST_DEVICE inline float round_to_int(float x) {
  constexpr float kShift = 0x1.8p23f;
  return (x + kShift) - kShift;
}

}  // namespace transcendental_detail

// e^x in fp32.
// Reduction: k = round(x·log2 e), r = x − k·ln2 with ln2 = L + Lrest (L = ln2 rounded to fp32).
// The first step fma(−k, L, x) is exact: when k != 0, |x| >= 0.34 so x is a multiple of 2^-25,
// as is k·L, and |x − k·L| < 0.5 fits in 24 bits. The second rounds once (<= u·|r|).
// e^r, |r| <= 0.35, by its degree-7 Taylor polynomial (truncation < 0.12u relative), Horner with
// fma. Then e^x = p·2^k1·2^k2 with k1 + k2 = k: the first scaling is exact (p·2^k1 stays normal),
// the second rounds once, into the subnormals or to infinity where the result lies there.
LS_HOST_DEVICE inline float ls_expf(float x) {
  using namespace transcendental_detail;
  constexpr float kLog2e = 0x1.715476p+0f;
  constexpr float kLn2 = 0x1.62e430p-1f;        // ln 2 rounded to fp32
  constexpr float kLn2Rest = -0x1.05c610p-29f;  // ln 2 − kLn2, rounded to fp32
  constexpr float kOverflow = 88.8f;            // e^x > FLT_MAX·(1 + 2^-24) above this
  constexpr float kUnderflow = -104.0f;         // e^x < 2^-150 (rounds to +0) below this
  const bool is_nan = x != x;
  const float xc = is_nan ? 0.0f : (x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x));
  const float kf = round_to_int(xc * kLog2e);
  float r = std::fma(-kf, kLn2, xc);
  r = std::fma(-kf, kLn2Rest, r);
  float p = 0x1.a01a02p-13f;                    // 1/7!
  p = std::fma(p, r, 0x1.6c16c2p-10f);          // 1/6!
  p = std::fma(p, r, 0x1.111112p-7f);           // 1/5!
  p = std::fma(p, r, 0x1.555556p-5f);           // 1/4!
  p = std::fma(p, r, 0x1.555556p-3f);           // 1/3!
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const auto k = static_cast<int32_t>(kf);      // in [-150, 128]
  const int32_t k1 = k / 2;
  const float y = (p * pow2i(k1)) * pow2i(k - k1);
  if (is_nan) return x + x;
  if (x > kOverflow) return float_of(0x7f800000u);
  if (x < kUnderflow) return 0.0f;
  return y;
}

// Natural logarithm in fp32.
// x = m·2^e with m in [√½, √2) from the exponent bits (subnormals first scaled by 2^23, exactly);
// f = m − 1 is exact (Sterbenz). log(1+f) = f − (f²/2 − s·(f²/2 + R)) with s = f/(2+f) and
// R = 2s²/3 + 2s⁴/5 + … + 2s¹⁰/11 (the atanh series of log((1+s)/(1−s)), |s| <= 0.172: truncation
// below 0.05u); the bracket is ~f²/2, so its own rounding errors are scaled down by |f|/2.
// log x = e·L + f + (e·Lrest − bracket), L = ln 2 to 16 bits so that e·L is exact; e·L + f is
// summed with its error recovered (Fast2Sum, |e·L| >= |f| whenever e != 0), so only the last
// addition rounds at full weight.
LS_HOST_DEVICE inline float ls_logf(float x) {
  using namespace transcendental_detail;
  constexpr float kLn2Hi = 0x1.62e4p-1f;         // ln 2 to 16 significant bits
  constexpr float kLn2Lo = 0x1.7f7d1cp-20f;      // ln 2 − kLn2Hi, rounded to fp32
  const bool subnormal = x < 0x1p-126f;
  const float xs = subnormal ? x * 0x1p23f : x;  // exact
  const uint32_t b = bits_of(xs);
  // Split off the exponent so that the significand lands in [√½, √2): measured from the bits of
  // √½ (0x3f3504f3), each binade of that shifted range is one value of e. (Garbage for x <= 0,
  // inf and NaN, which are selected away below; unsigned arithmetic keeps it free of UB.)
  const int32_t e_bits = static_cast<int32_t>(b - 0x3f3504f3u) >> 23;
  const float m = float_of(b - (static_cast<uint32_t>(e_bits) << 23));
  const int32_t e = e_bits - (subnormal ? 23 : 0);
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  float R = 0x1.745d18p-3f;                      // 2/11
  R = std::fma(R, z, 0x1.c71c72p-3f);            // 2/9
  R = std::fma(R, z, 0x1.24924ap-2f);            // 2/7
  R = std::fma(R, z, 0x1.99999ap-2f);            // 2/5
  R = std::fma(R, z, 0x1.555556p-1f);            // 2/3
  R = R * z;
  const float hfsq = 0.5f * f * f;
  const float bracket = std::fma(-s, hfsq + R, hfsq);
  const auto ef = static_cast<float>(e);
  const float hi_a = ef * kLn2Hi;                // exact: e has <= 8 bits, kLn2Hi 16
  const float hi = hi_a + f;                     // Fast2Sum
  const float lo = f - (hi - hi_a);
  const float y = hi + (lo + std::fma(ef, kLn2Lo, -bracket));
  if (!(x >= 0.0f)) return x != x ? x + x : float_of(0x7fc00000u);  // NaN in, or x < 0
  if (x == 0.0f) return float_of(0xff800000u);   // -inf
  if (x == float_of(0x7f800000u)) return x;      // +inf
  return y;
}

// Hyperbolic tangent in fp32.
// |x| < 0.9: tanh x = x + x³·P(x²), P of degree 7 fitted (Chebyshev, error < 5e-10 absolute in
// P) on x² in [0, 0.81]. |x| >= 0.9: tanh|x| = 1 − 2/(e^{2|x|} + 1) with ls_expf; there the
// subtraction loses at most a factor 2/(e^{2|x|} − 1) <= 0.5 of the quotient's relative error.
// Saturates to ±1 through e^{2|x|} = +inf, so no special case is needed beyond NaN and sign.
LS_HOST_DEVICE inline float ls_tanhf(float x) {
  using namespace transcendental_detail;
  const float a = std::fabs(x);                  // exact (sign bit only)
  const float z = x * x;
  float P = 0x1.7dd19ep-13f;
  P = std::fma(P, z, -0x1.106630p-10f);
  P = std::fma(P, z, 0x1.b5d44ep-9f);
  P = std::fma(P, z, -0x1.1f8378p-7f);
  P = std::fma(P, z, 0x1.660584p-6f);
  P = std::fma(P, z, -0x1.ba17fep-5f);
  P = std::fma(P, z, 0x1.111108p-3f);
  P = std::fma(P, z, -0x1.555556p-2f);
  // Both branches on |x|, the sign copied back at the end: tanh is odd, and this keeps -0.
  const float small = std::fma(a, z * P, a);
  const float e = ls_expf(2.0f * a);
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float y = float_of(bits_of(a < 0.9f ? small : large) | (bits_of(x) & 0x80000000u));
  return x != x ? x + x : y;
}

}  // namespace lockstep
