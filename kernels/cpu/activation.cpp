// GELU (tanh form), SwiGLU and the residual add on the CPU, canonical and fast modes.
//
// Elementwise only: no reductions, so threads split elements freely. Both modes evaluate the same
// expressions in the same order (kernels/ops/activation.hpp), one fp32 rounding per operation and
// no FMA. GELU uses ls_tanhf (transcendental.hpp) in both modes, a vector at a time
// (activation.isa.cpp: 8 lanes with AVX2, 16 with AVX-512, chosen by active_isa(); the same bits
// as the scalar code here, which handles the tail): libm's tanhf does not vectorise and made fast
// mode the slower one. SwiGLU: canonical ls_expf, fast libm's std::exp.
//
// Not here: GELU's erf form; fused bias+activation variants.
#include "kernels/ops/activation.hpp"

#include <cmath>

#include "kernels/cpu/activation_isa.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

using namespace gelu_constants;

struct CanonicalMath {
  static float tanh(float x) { return ls_tanhf(x); }
  static float exp(float x) { return ls_expf(x); }
};
struct LibmMath {
  static float exp(float x) { return std::exp(x); }
};

template <class M>
float gelu(float x) {
  const float arg = kK0 * (x + kK1 * ((x * x) * x));
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
  const float arg = kK0 * (x + kK1 * (x2 * x));
  const float th = M::tanh(arg);
  const float sech2 = (1.0f - th) * (1.0f + th);
  const float term = sech2 == 0.0f ? 0.0f : ((0.5f * x) * sech2) * (kK0 * (1.0f + kK1x3 * x2));
  return 0.5f * (1.0f + th) + term;
}

// silu(g) = g / (1 + exp(-g)): a division rather than g·sigmoid(g), one rounding fewer.
template <class M>
float silu(float g) {
  return g / (1.0f + M::exp(-g));
}

// The vector loops of the active ISA write the first elements; the scalar code finishes the last
// n % width.
void gelu_forward_simd(int64_t n, float* out, const float* inp) {
  const int64_t done = active_isa() == Isa::kAvx512 ? avx512::gelu_forward_vectors(n, out, inp)
                                                    : avx2::gelu_forward_vectors(n, out, inp);
  for (int64_t i = done; i < n; ++i) out[i] = gelu<CanonicalMath>(inp[i]);
}

void gelu_backward_simd(int64_t n, float* dinp, const float* inp, const float* dout) {
  const int64_t done = active_isa() == Isa::kAvx512 ? avx512::gelu_backward_vectors(n, dinp, inp, dout)
                                                    : avx2::gelu_backward_vectors(n, dinp, inp, dout);
  for (int64_t i = done; i < n; ++i) dinp[i] = gelu_grad<CanonicalMath>(inp[i]) * dout[i];
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

}  // namespace lockstep::cpu
