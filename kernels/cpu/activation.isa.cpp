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
using S = simd::Avx512;
#else
using S = simd::Avx2;
#endif
using V = S::V;
constexpr int64_t kLanes = S::kLanes;
inline V set1(float x) { return S::set1(x); }
inline V add(V a, V b) { return S::add(a, b); }
inline V sub(V a, V b) { return S::sub(a, b); }
inline V mul(V a, V b) { return S::mul(a, b); }
// where == 0 ? 0 : v
inline V zero_where_zero(V where, V v) { return S::select(S::eq(where, S::zero()), S::zero(), v); }

// gelu(x) = (0.5·x)·(1 + tanh(k0·(x + k1·((x·x)·x))))
inline V gelu(V x) {
  const V arg = mul(set1(kK0), add(x, mul(set1(kK1), mul(mul(x, x), x))));
  return mul(mul(set1(0.5f), x), add(set1(1.0f), simd::tanhf<S>(arg)));
}

// gelu'(x) as activation.cpp's gelu_grad: 0.5·(1 + th) + term, term = 0 where sech2 == 0.
inline V gelu_grad(V x) {
  const V one = set1(1.0f), half = set1(0.5f);
  const V x2 = mul(x, x);
  const V arg = mul(set1(kK0), add(x, mul(set1(kK1), mul(x2, x))));
  const V th = simd::tanhf<S>(arg);
  const V sech2 = mul(sub(one, th), add(one, th));
  const V term = mul(mul(mul(half, x), sech2), mul(set1(kK0), add(one, mul(set1(kK1x3), x2))));
  return add(mul(half, add(one, th)), zero_where_zero(sech2, term));
}

}  // namespace

int64_t gelu_forward_vectors(int64_t n, float* out, const float* inp) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) S::store(out + v * kLanes, gelu(S::load(inp + v * kLanes)));
  return nv * kLanes;
}

int64_t gelu_backward_vectors(int64_t n, float* dinp, const float* inp, const float* dout) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    S::store(dinp + v * kLanes, mul(gelu_grad(S::load(inp + v * kLanes)), S::load(dout + v * kLanes)));
  }
  return nv * kLanes;
}

}  // namespace lockstep::cpu::LS_ISA_NS
