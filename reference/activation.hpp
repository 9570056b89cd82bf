// Reference GELU (tanh form), SwiGLU and residual add, templated on the scalar type.
//
// Mirrors kernels/ops/activation.hpp operation for operation (same association, same fp32
// constants converted to Real), so that a Bounded<T> instantiation bounds exactly the roundings
// the kernels perform; tanh and exp are found by ADL (std:: for double, Boost.Multiprecision for
// MPFR, reference/bounded.hpp for Bounded<T>, which charges the kernels' documented accuracy).
// Not here: GELU's erf form.
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/bounded.hpp"

namespace lockstep::reference {

// The kernels' fp32 constants (kernels/cpu/activation.cpp).
inline constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/π) rounded to fp32
inline constexpr float kGeluK1 = 0.044715f;

// out = (0.5·x)·(1 + tanh(k0·(x + k1·((x·x)·x))))
template <class Real>
void gelu_forward(int64_t n,
                  Real* out,                                      // (n)
                  const Real* inp) {                              // (n)
  using std::tanh;
  for (int64_t i = 0; i < n; ++i) {
    const Real& x = inp[i];
    const Real arg = Real(kGeluK0) * (x + Real(kGeluK1) * ((x * x) * x));
    out[i] = (Real(0.5f) * x) * (Real(1) + tanh(arg));
  }
}

// d/dx = 0.5·(1 + th) + ((0.5·x)·((1 − th)·(1 + th)))·(k0·(1 + 3k1·x²));  dinp = that · dout
// 3k1 is Real(3)·Real(k1): exact in MPFR (the true derivative of the forward), one rounding in
// Bounded<T>, which covers the kernel's fp32 constant 3.0f·k1, and in CanonicalF32 that constant.
// As in the kernel, the second term is 0 where sech2 is 0 (x² may overflow there).
template <class Real>
void gelu_backward(int64_t n,
                   Real* dinp,                                    // (n) overwritten
                   const Real* inp, const Real* dout) {           // (n) (n)
  using std::tanh;
  for (int64_t i = 0; i < n; ++i) {
    const Real& x = inp[i];
    const Real x2 = x * x;
    const Real th = tanh(Real(kGeluK0) * (x + Real(kGeluK1) * (x2 * x)));
    const Real sech2 = (Real(1) - th) * (Real(1) + th);
    const Real term = sech2 == Real(0) ? Real(0)
                                       : ((Real(0.5f) * x) * sech2) *
                                             (Real(kGeluK0) * (Real(1) + (Real(3) * Real(kGeluK1)) * x2));
    dinp[i] = (Real(0.5f) * (Real(1) + th) + term) * dout[i];
  }
}

// out = (g / (1 + exp(-g)))·up on rows [gate | up] of width 2F.
template <class Real>
void swiglu_forward(int64_t N, int64_t F,
                    Real* out,                                    // (N, F)
                    const Real* inp) {                            // (N, 2F)
  using std::exp;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < F; ++f) {
      const Real& g = inp[n * 2 * F + f];
      out[n * F + f] = (g / (Real(1) + exp(-g))) * inp[n * 2 * F + F + f];
    }
  }
}

// den = 1 + exp(-g), sig = 1/den:  dgate = (dout·up)·(sig·(1 + g·(1 − sig))),  dup = dout·(g/den)
template <class Real>
void swiglu_backward(int64_t N, int64_t F,
                     Real* dinp,                                  // (N, 2F) overwritten
                     const Real* inp, const Real* dout) {         // (N, 2F) (N, F)
  using std::exp;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < F; ++f) {
      const Real& g = inp[n * 2 * F + f];
      const Real& up = inp[n * 2 * F + F + f];
      const Real& dy = dout[n * F + f];
      const Real den = Real(1) + exp(-g);
      const Real sig = Real(1) / den;
      dinp[n * 2 * F + f] = (dy * up) * (sig * (Real(1) + g * (Real(1) - sig)));
      dinp[n * 2 * F + F + f] = dy * (g / den);
    }
  }
}

template <class Real>
void residual_forward(int64_t n, Real* out, const Real* a, const Real* b) {  // (n) (n) (n)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace lockstep::reference
