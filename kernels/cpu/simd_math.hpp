// Internal: ls_expf and ls_tanhf (kernels/ops/transcendental.hpp) on 8 floats at once with AVX2+FMA,
// and on 16 with AVX-512 where the including file is compiled for it (an *.isa.cpp file's avx512
// build, kernels/CMakeLists.txt), bit for bit the scalar functions: every lane performs the scalar
// code's operations in the same order with the same roundings (mul, add and fma as written there,
// nothing fused that the scalar code does not fuse), and the scalar code's selects become blends.
// The kernels are compiled with -mavx2 -mfma (the floor of kernels/cpu/isa.hpp), so the 8-lane
// functions need no run-time dispatch; the 16-lane ones are reached through active_isa().
// tests/unit/kernels_elementwise checks both widths bitwise against the scalar functions, and GELU,
// which runs on them, against its scalar specification on both ISAs; tests/property checks every
// canonical kernel against the CanonicalF32 reference.
// Not here: log (no vectorised caller yet).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace lockstep::cpu::simd {

using V8 = __m256;

inline V8 set1(float x) { return _mm256_set1_ps(x); }
inline V8 select(V8 mask, V8 if_true, V8 if_false) { return _mm256_blendv_ps(if_false, if_true, mask); }

// 2^k for k in [-126, 127] from the exponent field, as transcendental_detail::pow2i.
inline V8 pow2i(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

// ls_expf, lane by lane.
inline V8 expf8(V8 x) {
  const V8 kOverflow = set1(88.8f), kUnderflow = set1(-104.0f);
  const V8 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  // xc = is_nan ? 0 : (x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x))
  V8 xc = select(_mm256_cmp_ps(x, kOverflow, _CMP_GT_OQ), kOverflow, x);
  xc = select(_mm256_cmp_ps(x, kUnderflow, _CMP_LT_OQ), kUnderflow, xc);
  xc = select(is_nan, _mm256_setzero_ps(), xc);
  // kf = round_to_int(xc·log2e): the 1.5·2^23 shift, two separate roundings as in the scalar code
  const V8 kShift = set1(0x1.8p23f);
  const V8 kf = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, set1(0x1.715476p+0f)), kShift), kShift);
  // r = fma(-kf, L, xc); r = fma(-kf, Lrest, r): fnmadd computes -(a·b) + c, the same exact value
  V8 r = _mm256_fnmadd_ps(kf, set1(0x1.62e430p-1f), xc);
  r = _mm256_fnmadd_ps(kf, set1(-0x1.05c610p-29f), r);
  V8 p = set1(0x1.a01a02p-13f);
  p = _mm256_fmadd_ps(p, r, set1(0x1.6c16c2p-10f));
  p = _mm256_fmadd_ps(p, r, set1(0x1.111112p-7f));
  p = _mm256_fmadd_ps(p, r, set1(0x1.555556p-5f));
  p = _mm256_fmadd_ps(p, r, set1(0x1.555556p-3f));
  p = _mm256_fmadd_ps(p, r, set1(0.5f));
  p = _mm256_fmadd_ps(p, r, set1(1.0f));
  p = _mm256_fmadd_ps(p, r, set1(1.0f));
  // k1 = k / 2 truncated toward zero (C++ integer division): add the sign bit before the shift
  const __m256i k = _mm256_cvttps_epi32(kf);  // kf is an integer in [-150, 128]: exact
  const __m256i k1 = _mm256_srai_epi32(_mm256_add_epi32(k, _mm256_srli_epi32(k, 31)), 1);
  V8 y = _mm256_mul_ps(_mm256_mul_ps(p, pow2i(k1)), pow2i(_mm256_sub_epi32(k, k1)));
  y = select(_mm256_cmp_ps(x, kUnderflow, _CMP_LT_OQ), _mm256_setzero_ps(), y);
  y = select(_mm256_cmp_ps(x, kOverflow, _CMP_GT_OQ), set1(__builtin_inff()), y);
  return select(is_nan, _mm256_add_ps(x, x), y);
}

// ls_tanhf, lane by lane.
inline V8 tanhf8(V8 x) {
  const V8 sign = set1(-0.0f);
  const V8 a = _mm256_andnot_ps(sign, x);
  const V8 z = _mm256_mul_ps(x, x);
  V8 P = set1(0x1.7dd19ep-13f);
  P = _mm256_fmadd_ps(P, z, set1(-0x1.106630p-10f));
  P = _mm256_fmadd_ps(P, z, set1(0x1.b5d44ep-9f));
  P = _mm256_fmadd_ps(P, z, set1(-0x1.1f8378p-7f));
  P = _mm256_fmadd_ps(P, z, set1(0x1.660584p-6f));
  P = _mm256_fmadd_ps(P, z, set1(-0x1.ba17fep-5f));
  P = _mm256_fmadd_ps(P, z, set1(0x1.111108p-3f));
  P = _mm256_fmadd_ps(P, z, set1(-0x1.555556p-2f));
  const V8 small = _mm256_fmadd_ps(a, _mm256_mul_ps(z, P), a);
  const V8 e = expf8(_mm256_mul_ps(set1(2.0f), a));
  const V8 one = set1(1.0f);
  const V8 large = _mm256_sub_ps(one, _mm256_div_ps(set1(2.0f), _mm256_add_ps(e, one)));
  const V8 mag = select(_mm256_cmp_ps(a, set1(0.9f), _CMP_LT_OQ), small, large);
  const V8 y = _mm256_or_ps(mag, _mm256_and_ps(x, sign));
  return select(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), _mm256_add_ps(x, x), y);
}

#if defined(__AVX512F__)
// The same two functions on 16 lanes (AVX-512 F/DQ), line for line those above. Integer shifts
// and the conversion use the zero-masked forms with every lane selected (the same results): GCC 12
// warns (-Wmaybe-uninitialized) on the unmasked ones, whose pass-through is _mm512_undefined_*.
using V16 = __m512;
constexpr __mmask16 kAll16 = 0xffff;

inline V16 set1_16(float x) { return _mm512_set1_ps(x); }

inline V16 pow2i16(__m512i k) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, _mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
}

// ls_expf, lane by lane. _mm512_mask_blend_ps(m, a, b) takes b where m is set.
inline V16 expf16(V16 x) {
  const V16 kOverflow = set1_16(88.8f), kUnderflow = set1_16(-104.0f);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 over = _mm512_cmp_ps_mask(x, kOverflow, _CMP_GT_OQ);
  const __mmask16 under = _mm512_cmp_ps_mask(x, kUnderflow, _CMP_LT_OQ);
  V16 xc = _mm512_mask_blend_ps(over, x, kOverflow);
  xc = _mm512_mask_blend_ps(under, xc, kUnderflow);
  xc = _mm512_mask_blend_ps(is_nan, xc, _mm512_setzero_ps());
  const V16 kShift = set1_16(0x1.8p23f);
  const V16 kf = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(xc, set1_16(0x1.715476p+0f)), kShift), kShift);
  V16 r = _mm512_fnmadd_ps(kf, set1_16(0x1.62e430p-1f), xc);
  r = _mm512_fnmadd_ps(kf, set1_16(-0x1.05c610p-29f), r);
  V16 p = set1_16(0x1.a01a02p-13f);
  p = _mm512_fmadd_ps(p, r, set1_16(0x1.6c16c2p-10f));
  p = _mm512_fmadd_ps(p, r, set1_16(0x1.111112p-7f));
  p = _mm512_fmadd_ps(p, r, set1_16(0x1.555556p-5f));
  p = _mm512_fmadd_ps(p, r, set1_16(0x1.555556p-3f));
  p = _mm512_fmadd_ps(p, r, set1_16(0.5f));
  p = _mm512_fmadd_ps(p, r, set1_16(1.0f));
  p = _mm512_fmadd_ps(p, r, set1_16(1.0f));
  const __m512i k = _mm512_maskz_cvttps_epi32(kAll16, kf);
  const __m512i k1 = _mm512_maskz_srai_epi32(kAll16, _mm512_add_epi32(k, _mm512_maskz_srli_epi32(kAll16, k, 31)), 1);
  V16 y = _mm512_mul_ps(_mm512_mul_ps(p, pow2i16(k1)), pow2i16(_mm512_sub_epi32(k, k1)));
  y = _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
  y = _mm512_mask_blend_ps(over, y, set1_16(__builtin_inff()));
  return _mm512_mask_blend_ps(is_nan, y, _mm512_add_ps(x, x));
}

// ls_tanhf, lane by lane.
inline V16 tanhf16(V16 x) {
  const V16 sign = set1_16(-0.0f);
  const V16 a = _mm512_andnot_ps(sign, x);
  const V16 z = _mm512_mul_ps(x, x);
  V16 P = set1_16(0x1.7dd19ep-13f);
  P = _mm512_fmadd_ps(P, z, set1_16(-0x1.106630p-10f));
  P = _mm512_fmadd_ps(P, z, set1_16(0x1.b5d44ep-9f));
  P = _mm512_fmadd_ps(P, z, set1_16(-0x1.1f8378p-7f));
  P = _mm512_fmadd_ps(P, z, set1_16(0x1.660584p-6f));
  P = _mm512_fmadd_ps(P, z, set1_16(-0x1.ba17fep-5f));
  P = _mm512_fmadd_ps(P, z, set1_16(0x1.111108p-3f));
  P = _mm512_fmadd_ps(P, z, set1_16(-0x1.555556p-2f));
  const V16 small = _mm512_fmadd_ps(a, _mm512_mul_ps(z, P), a);
  const V16 e = expf16(_mm512_mul_ps(set1_16(2.0f), a));
  const V16 one = set1_16(1.0f);
  const V16 large = _mm512_sub_ps(one, _mm512_div_ps(set1_16(2.0f), _mm512_add_ps(e, one)));
  const V16 mag = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, set1_16(0.9f), _CMP_LT_OQ), large, small);
  const V16 y = _mm512_or_ps(mag, _mm512_and_ps(x, sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}
#endif

}  // namespace lockstep::cpu::simd
