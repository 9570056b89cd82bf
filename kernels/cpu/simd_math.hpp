// Internal: ls_expf and ls_tanhf (kernels/ops/transcendental.hpp) on a vector of floats, bit for bit
// the scalar functions: every lane performs the scalar code's operations in the same order with the
// same roundings (mul, add and fma as written there, nothing fused that the scalar code does not
// fuse), and the scalar code's selects become blends.
// One definition serves every width: expf and tanhf are written once over a width's operations,
// Avx2 (8 lanes, AVX2+FMA, the floor of kernels/cpu/isa.hpp, so no run-time dispatch) and Avx512
// (16 lanes, where the including file is compiled for it: an *.isa.cpp file's avx512 build,
// kernels/CMakeLists.txt, reached through active_isa()).
// tests/unit/kernels_elementwise checks the 8-lane functions bitwise against the scalar ones, and
// GELU, which runs on both widths, against its scalar specification on both ISAs; tests/property
// checks every canonical kernel against the CanonicalF32 reference.
// Beside them, first_max (a row's maximum as the scalar loop finds it, in 8 lanes) and
// load_transposed8: the block loads through which canonical kernels run eight reduction chains
// side by side, one chain per lane (see its comment).
// Not here: log (no vectorised caller yet).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace lockstep::cpu::simd {

// A width's operations (shift counts are template arguments: the intrinsics want immediates). Mask is whatever its comparisons yield (a vector of all-ones lanes for
// AVX2, a bit mask for AVX-512); select(m, a, b) takes a where m is set, b elsewhere.
struct Avx2 {
  static constexpr int kLanes = 8;
  using V = __m256;
  using I = __m256i;
  using Mask = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }  // -(a·b) + c, one rounding
  static V bit_and(V a, V b) { return _mm256_and_ps(a, b); }
  static V bit_andnot(V a, V b) { return _mm256_andnot_ps(a, b); }  // ~a & b
  static V bit_or(V a, V b) { return _mm256_or_ps(a, b); }
  static Mask gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Mask lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Mask eq(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static Mask unordered(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
  static V select(Mask m, V if_true, V if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static I trunc_to_int(V v) { return _mm256_cvttps_epi32(v); }
  static I iset1(int32_t x) { return _mm256_set1_epi32(x); }
  static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int n>
  static I shl(I a) { return _mm256_slli_epi32(a, n); }
  template <int n>
  static I shr_logical(I a) { return _mm256_srli_epi32(a, n); }
  template <int n>
  static I shr_arith(I a) { return _mm256_srai_epi32(a, n); }
  static V as_float(I a) { return _mm256_castsi256_ps(a); }
};

#if defined(__AVX512F__)
// Integer shifts and the conversion use the zero-masked forms with every lane selected (the same
// results): GCC 12 warns (-Wmaybe-uninitialized) on the unmasked ones, whose pass-through is
// _mm512_undefined_*.
struct Avx512 {
  static constexpr int kLanes = 16;
  static constexpr __mmask16 kAll = 0xffff;
  using V = __m512;
  using I = __m512i;
  using Mask = __mmask16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V bit_and(V a, V b) { return _mm512_and_ps(a, b); }
  static V bit_andnot(V a, V b) { return _mm512_andnot_ps(a, b); }
  static V bit_or(V a, V b) { return _mm512_or_ps(a, b); }
  static Mask gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask eq(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static Mask unordered(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static V select(Mask m, V if_true, V if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static I trunc_to_int(V v) { return _mm512_maskz_cvttps_epi32(kAll, v); }
  static I iset1(int32_t x) { return _mm512_set1_epi32(x); }
  static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int n>
  static I shl(I a) { return _mm512_maskz_slli_epi32(kAll, a, n); }
  template <int n>
  static I shr_logical(I a) { return _mm512_maskz_srli_epi32(kAll, a, n); }
  template <int n>
  static I shr_arith(I a) { return _mm512_maskz_srai_epi32(kAll, a, n); }
  static V as_float(I a) { return _mm512_castsi512_ps(a); }
};
#endif

// 2^k for k in [-126, 127] from the exponent field, as transcendental_detail::pow2i.
template <class S>
inline typename S::V pow2i(typename S::I k) {
  return S::as_float(S::template shl<23>(S::iadd(k, S::iset1(127))));
}

// ls_expf, lane by lane.
template <class S>
inline typename S::V expf(typename S::V x) {
  using V = typename S::V;
  const V kOverflow = S::set1(88.8f), kUnderflow = S::set1(-104.0f);
  const auto is_nan = S::unordered(x, x);
  const auto over = S::gt(x, kOverflow);
  const auto under = S::lt(x, kUnderflow);
  // xc = is_nan ? 0 : (x > kOverflow ? kOverflow : (x < kUnderflow ? kUnderflow : x))
  V xc = S::select(over, kOverflow, x);
  xc = S::select(under, kUnderflow, xc);
  xc = S::select(is_nan, S::zero(), xc);
  // kf = round_to_int(xc·log2e): the 1.5·2^23 shift, two separate roundings as in the scalar code
  const V kShift = S::set1(0x1.8p23f);
  const V kf = S::sub(S::add(S::mul(xc, S::set1(0x1.715476p+0f)), kShift), kShift);
  // r = fma(-kf, L, xc); r = fma(-kf, Lrest, r): fnmadd computes -(a·b) + c, the same exact value
  V r = S::fnmadd(kf, S::set1(0x1.62e430p-1f), xc);
  r = S::fnmadd(kf, S::set1(-0x1.05c610p-29f), r);
  V p = S::set1(0x1.a01a02p-13f);
  p = S::fmadd(p, r, S::set1(0x1.6c16c2p-10f));
  p = S::fmadd(p, r, S::set1(0x1.111112p-7f));
  p = S::fmadd(p, r, S::set1(0x1.555556p-5f));
  p = S::fmadd(p, r, S::set1(0x1.555556p-3f));
  p = S::fmadd(p, r, S::set1(0.5f));
  p = S::fmadd(p, r, S::set1(1.0f));
  p = S::fmadd(p, r, S::set1(1.0f));
  // k1 = k / 2 truncated toward zero (C++ integer division): add the sign bit before the shift
  const auto k = S::trunc_to_int(kf);  // kf is an integer in [-150, 128]: exact
  const auto k1 = S::template shr_arith<1>(S::iadd(k, S::template shr_logical<31>(k)));
  V y = S::mul(S::mul(p, pow2i<S>(k1)), pow2i<S>(S::isub(k, k1)));
  y = S::select(under, S::zero(), y);
  y = S::select(over, S::set1(__builtin_inff()), y);
  return S::select(is_nan, S::add(x, x), y);
}

// ls_tanhf, lane by lane.
template <class S>
inline typename S::V tanhf(typename S::V x) {
  using V = typename S::V;
  const V sign = S::set1(-0.0f);
  const V a = S::bit_andnot(sign, x);
  const V z = S::mul(x, x);
  V P = S::set1(0x1.7dd19ep-13f);
  P = S::fmadd(P, z, S::set1(-0x1.106630p-10f));
  P = S::fmadd(P, z, S::set1(0x1.b5d44ep-9f));
  P = S::fmadd(P, z, S::set1(-0x1.1f8378p-7f));
  P = S::fmadd(P, z, S::set1(0x1.660584p-6f));
  P = S::fmadd(P, z, S::set1(-0x1.ba17fep-5f));
  P = S::fmadd(P, z, S::set1(0x1.111108p-3f));
  P = S::fmadd(P, z, S::set1(-0x1.555556p-2f));
  const V small = S::fmadd(a, S::mul(z, P), a);
  const V e = expf<S>(S::mul(S::set1(2.0f), a));
  const V one = S::set1(1.0f);
  const V large = S::sub(one, S::div(S::set1(2.0f), S::add(e, one)));
  const V mag = S::select(S::lt(a, S::set1(0.9f)), small, large);
  const V y = S::bit_or(mag, S::bit_and(x, sign));
  return S::select(S::unordered(x, x), S::add(x, x), y);
}

// The 8-lane forms the row kernels (attention, cross-entropy) call directly.
using V8 = Avx2::V;
inline V8 set1(float x) { return Avx2::set1(x); }
inline V8 expf8(V8 x) { return expf<Avx2>(x); }
inline V8 tanhf8(V8 x) { return tanhf<Avx2>(x); }

// The first maximal element of x[0, n) in index order, NaN skipped, as the scalar loop
//   m = -inf; for i: m = x[i] > m ? x[i] : m
// finds it. Eight lanes keep their own maxima (max_ps returns its second operand, the running
// maximum, when x[i] is NaN: skipped as in the loop). Equal non-zero values have equal bits, so
// the lanes' combination is the loop's value unless the maximum is a zero, whose sign is the first
// zero's: that row is rescanned by the loop.
inline float first_max(const float* x, int64_t n) {
  __m256 lanes = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(x + i), lanes);
  alignas(32) float lane[8];
  _mm256_store_ps(lane, lanes);
  float m = -__builtin_inff();
  for (float l : lane) m = l > m ? l : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  if (m != 0.0f) return m;
  m = -__builtin_inff();
  for (i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// r[i] lane j = p[j·stride + i] for i, j < 8: an 8x8 block read transposed. Canonical kernels run
// eight chains of a reduction side by side with it — chain j over p[j·stride + i], i increasing,
// one link per r[i] in order — so each lane performs exactly its chain's operations: the chains'
// bits do not change, while eight of them advance per vector instruction instead of one scalar
// chain waiting on every addition.
inline void load_transposed8(const float* p, int64_t stride, V8 r[8]) {
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(p + j * stride);
  const V8 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const V8 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const V8 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const V8 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const V8 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const V8 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const V8 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const V8 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

}  // namespace lockstep::cpu::simd
