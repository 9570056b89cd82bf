// GELU (tanh form), SwiGLU and the residual add on the CPU, canonical and fast modes.
//
// Elementwise only: no reductions, so threads split elements freely. Both modes evaluate the same
// expressions in the same order (kernels/ops/activation.hpp), one fp32 rounding per operation and
// no FMA. GELU uses ls_tanhf (transcendental.hpp) in both modes, 8 elements at a time with AVX2
// (simd_math.hpp, the same bits as the scalar code, which handles the tail): libm's tanhf does not
// vectorise and made fast mode the slower one. SwiGLU: canonical ls_expf, fast libm's std::exp.
//
// Not here: GELU's erf form; fused bias+activation variants.
#include "kernels/ops/activation.hpp"

#include <cmath>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/π) rounded to fp32
constexpr float kGeluK1 = 0.044715f;
constexpr float kGeluK1x3 = 3.0f * kGeluK1;     // d(k1·x³)/dx = 3·k1·x², 3·k1 rounded once

struct CanonicalMath {
  static float tanh(float x) { return ls_tanhf(x); }
  static float exp(float x) { return ls_expf(x); }
};
struct LibmMath {
  static float exp(float x) { return std::exp(x); }
};

template <class M>
float gelu(float x) {
  const float arg = kGeluK0 * (x + kGeluK1 * ((x * x) * x));
  return (0.5f * x) * (1.0f + M::tanh(arg));
}

// Forward: out = (0.5·x)·(1 + tanh(k0·(x + k1·x³)))
//   d/dx = 0.5·(1 + th) + (0.5·x)·(1 − th²)·k0·(1 + 3·k1·x²)
// 1 − th² is evaluated as (1 − th)·(1 + th): 1 − th is exact for th in [0.5, 1], so the factor
// keeps its relative accuracy where th approaches ±1. Where it rounds to 0 (|arg| >~ 9) the whole
// second term is 0: for huge |x|, x² may overflow and 0·inf would otherwise give NaN.
template <class M>
float gelu_grad(float x) {
  const float x2 = x * x;
  const float arg = kGeluK0 * (x + kGeluK1 * (x2 * x));
  const float th = M::tanh(arg);
  const float sech2 = (1.0f - th) * (1.0f + th);
  const float term = sech2 == 0.0f ? 0.0f : ((0.5f * x) * sech2) * (kGeluK0 * (1.0f + kGeluK1x3 * x2));
  return 0.5f * (1.0f + th) + term;
}

// silu(g) = g / (1 + exp(-g)): a division rather than g·sigmoid(g), one rounding fewer.
template <class M>
float silu(float g) {
  return g / (1.0f + M::exp(-g));
}

// The same two functions on 8 lanes: each lane runs gelu / gelu_grad's operations in order.
inline simd::V8 gelu8(simd::V8 x) {
  using namespace simd;
  const V8 arg = _mm256_mul_ps(set1(kGeluK0),
                               _mm256_add_ps(x, _mm256_mul_ps(set1(kGeluK1), _mm256_mul_ps(_mm256_mul_ps(x, x), x))));
  return _mm256_mul_ps(_mm256_mul_ps(set1(0.5f), x), _mm256_add_ps(set1(1.0f), tanhf8(arg)));
}

inline simd::V8 gelu_grad8(simd::V8 x) {
  using namespace simd;
  const V8 one = set1(1.0f), half = set1(0.5f);
  const V8 x2 = _mm256_mul_ps(x, x);
  const V8 arg = _mm256_mul_ps(set1(kGeluK0), _mm256_add_ps(x, _mm256_mul_ps(set1(kGeluK1), _mm256_mul_ps(x2, x))));
  const V8 th = tanhf8(arg);
  const V8 sech2 = _mm256_mul_ps(_mm256_sub_ps(one, th), _mm256_add_ps(one, th));
  const V8 term = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2),
                                _mm256_mul_ps(set1(kGeluK0), _mm256_add_ps(one, _mm256_mul_ps(set1(kGeluK1x3), x2))));
  const V8 term0 = select(_mm256_cmp_ps(sech2, _mm256_setzero_ps(), _CMP_EQ_OQ), _mm256_setzero_ps(), term);
  return _mm256_add_ps(_mm256_mul_ps(half, _mm256_add_ps(one, th)), term0);
}

// Threads take blocks of whole vectors; the scalar code finishes the last n % 8 elements.
constexpr int64_t kLanes = 8;

void gelu_forward_simd(int64_t n, float* out, const float* inp) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) _mm256_storeu_ps(out + v * kLanes, gelu8(_mm256_loadu_ps(inp + v * kLanes)));
  for (int64_t i = nv * kLanes; i < n; ++i) out[i] = gelu<CanonicalMath>(inp[i]);
}

void gelu_backward_simd(int64_t n, float* dinp, const float* inp, const float* dout) {
  const int64_t nv = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    const float* x = inp + v * kLanes;
    _mm256_storeu_ps(dinp + v * kLanes, _mm256_mul_ps(gelu_grad8(_mm256_loadu_ps(x)), _mm256_loadu_ps(dout + v * kLanes)));
  }
  for (int64_t i = nv * kLanes; i < n; ++i) dinp[i] = gelu_grad<CanonicalMath>(inp[i]) * dout[i];
}

template <class M>
void swiglu_forward_impl(int64_t N, int64_t F, float* out, const float* inp) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    float* o = out + n * F;
    for (int64_t f = 0; f < F; ++f) o[f] = silu<M>(gate[f]) * up[f];
  }
}

// Forward: out = silu(g)·up, silu(g) = g / (1 + e^{-g}); with sig = 1 / (1 + e^{-g}):
//   dgate = (dout·up)·(sig·(1 + g·(1 − sig)))      (silu'(g) = sig·(1 + g·(1 − sig)))
//   dup   = dout·silu(g)                           (silu(g) evaluated as in the forward)
template <class M>
void swiglu_backward_impl(int64_t N, int64_t F, float* dinp, const float* inp, const float* dout) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    const float* dy = dout + n * F;
    float* dgate = dinp + n * 2 * F;
    float* dup = dgate + F;
    for (int64_t f = 0; f < F; ++f) {
      const float g = gate[f];
      const float den = 1.0f + M::exp(-g);
      const float sig = 1.0f / den;
      const float dsilu = sig * (1.0f + g * (1.0f - sig));
      dgate[f] = (dy[f] * up[f]) * dsilu;
      dup[f] = dy[f] * (g / den);
    }
  }
}

}  // namespace

void gelu_forward(Mode mode, int64_t n, float* out, const float* inp) {
  LS_REQUIRE(n >= 0, "gelu_forward: n (", n, ") must be >= 0");
  gelu_forward_simd(n, out, inp);  // both modes: see the file header
}

void gelu_backward(Mode mode, int64_t n, float* dinp, const float* inp, const float* dout) {
  LS_REQUIRE(n >= 0, "gelu_backward: n (", n, ") must be >= 0");
  gelu_backward_simd(n, dinp, inp, dout);  // both modes: see the file header
}

void swiglu_forward(Mode mode, int64_t N, int64_t F, float* out, const float* inp) {
  LS_REQUIRE(N >= 0 && F >= 0, "swiglu_forward: need N, F >= 0, got N=", N, " F=", F);
  if (mode == Mode::kCanonical) {
    swiglu_forward_impl<CanonicalMath>(N, F, out, inp);
  } else {
    swiglu_forward_impl<LibmMath>(N, F, out, inp);
  }
}

void swiglu_backward(Mode mode, int64_t N, int64_t F, float* dinp, const float* inp,
                     const float* dout) {
  LS_REQUIRE(N >= 0 && F >= 0, "swiglu_backward: need N, F >= 0, got N=", N, " F=", F);
  if (mode == Mode::kCanonical) {
    swiglu_backward_impl<CanonicalMath>(N, F, dinp, inp, dout);
  } else {
    swiglu_backward_impl<LibmMath>(N, F, dinp, inp, dout);
  }
}

void residual_forward(int64_t n, float* out, const float* a, const float* b) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace lockstep::cpu
