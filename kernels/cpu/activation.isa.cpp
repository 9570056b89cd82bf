// GELU's vector loops, compiled once per ISA (kernels/CMakeLists.txt): 8 lanes with AVX2, 16 with
// AVX-512. Each lane runs the scalar gelu / gelu_grad of activation.cpp operation for operation
// (simd_math.hpp's tanh, one rounding per mul, add and sub, no FMA), so both widths give the
// scalar code's bits; activation.cpp dispatches on active_isa() and does the tail.
// Not here: SwiGLU and the residual add (activation.cpp), the scalar specification.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/activation_isa.hpp"
#include "kernels/cpu/simd_math.hpp"

#ifndef LS_ISA_NS
#error "activation.isa.cpp is compiled once per ISA with -DLS_ISA_NS=avx2 or -DLS_ISA_NS=avx512"
#endif

namespace lockstep::cpu::LS_ISA_NS {
namespace {

using namespace gelu_constants;

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
using V = __m512;
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V set1(float x) { return _mm512_set1_ps(x); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vtanh(V x) { return simd::tanhf16(x); }
// where == 0 ? 0 : v
inline V zero_where_zero(V where, V v) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(where, _mm512_setzero_ps(), _CMP_EQ_OQ), v, _mm512_setzero_ps());
}
#else
constexpr int64_t kLanes = 8;
using V = __m256;
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V set1(float x) { return _mm256_set1_ps(x); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vtanh(V x) { return simd::tanhf8(x); }
inline V zero_where_zero(V where, V v) {
  return simd::select(_mm256_cmp_ps(where, _mm256_setzero_ps(), _CMP_EQ_OQ), _mm256_setzero_ps(), v);
}
#endif

// gelu(x) = (0.5·x)·(1 + tanh(k0·(x + k1·((x·x)·x))))
inline V gelu(V x) {
  const V arg = mul(set1(kK0), add(x, mul(set1(kK1), mul(mul(x, x), x))));
  return mul(mul(set1(0.5f), x), add(set1(1.0f), vtanh(arg)));
}

// gelu'(x) as activation.cpp's gelu_grad: 0.5·(1 + th) + term, term = 0 where sech2 == 0.
inline V gelu_grad(V x) {
  const V one = set1(1.0f), half = set1(0.5f);
  const V x2 = mul(x, x);
  const V arg = mul(set1(kK0), add(x, mul(set1(kK1), mul(x2, x))));
  const V th = vtanh(arg);
  const V sech2 = mul(sub(one, th), add(one, th));
  const V term = mul(mul(mul(half, x), sech2), mul(set1(kK0), add(one, mul(set1(kK1x3), x2))));
  return add(mul(half, add(one, th)), zero_where_zero(sech2, term));
}

}  // namespace

int64_t gelu_forward_vectors(int64_t n, float* out, const float* inp) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) store(out + v * kLanes, gelu(load(inp + v * kLanes)));
  return nv * kLanes;
}

int64_t gelu_backward_vectors(int64_t n, float* dinp, const float* inp, const float* dout) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    store(dinp + v * kLanes, mul(gelu_grad(load(inp + v * kLanes)), load(dout + v * kLanes)));
  }
  return nv * kLanes;
}

}  // namespace lockstep::cpu::LS_ISA_NS
