// Feed-forward activations.
//
// GELU, tanh form (docs/numerics.md: the config names the form; the reference uses the same):
//   out = 0.5·x·(1 + tanh(k0·(x + k1·x³))), k0 = sqrt(2/π), k1 = 0.044715 (fp32 constants)
// SwiGLU on a fused (N, 2F) input holding [gate | up] per row:
//   out = silu(gate)·up, silu(g) = g / (1 + exp(-g))
// Elementwise, no reductions. GELU uses transcendental.hpp's tanh in both modes (it vectorises,
// libm's does not), so its two modes give the same bits; SwiGLU uses transcendental.hpp's exp in
// canonical mode and libm's in fast mode. All evaluate exactly this order, one fp32 rounding per
// operation, no FMA:
//   GELU fwd    out = (0.5·x)·(1 + tanh(k0·(x + k1·((x·x)·x))))
//   GELU bwd    x2 = x·x;  th = tanh(k0·(x + k1·(x2·x)));  sech2 = (1 - th)·(1 + th);
//               term = ((0.5·x)·sech2)·(k0·(1 + k3·x2)), k3 = 3·k1 rounded to fp32, and
//               term = 0 where sech2 == 0 (x² may overflow there and 0·inf would be NaN);
//               dinp = (0.5·(1 + th) + term)·dout
//   SwiGLU fwd  out = (g / (1 + exp(-g)))·up
//   SwiGLU bwd  den = 1 + exp(-g);  sig = 1/den;  dgate = (dout·up)·(sig·(1 + g·(1 - sig)));
//               dup = dout·(g/den)
// Non-finite inputs follow the formulas: NaN stays NaN; gelu(+inf) = +inf, gelu(-inf) = NaN,
// silu(+inf) = +inf, silu(-inf) = NaN.
// Backward overwrites dinp (these inputs feed only this op).
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep::cpu {

void gelu_forward(Mode mode, int64_t n,
                  float* out,                                     // (n)
                  const float* inp);                              // (n)
void gelu_backward(Mode mode, int64_t n,
                   float* dinp,                                   // (n) overwritten
                   const float* inp, const float* dout);          // (n) (n)

void swiglu_forward(Mode mode, int64_t N, int64_t F,
                    float* out,                                   // (N, F)
                    const float* inp);                            // (N, 2F) = [gate | up]
void swiglu_backward(Mode mode, int64_t N, int64_t F,
                     float* dinp,                                 // (N, 2F) overwritten
                     const float* inp, const float* dout);        // (N, 2F) (N, F)

}  // namespace lockstep::cpu
