// LayerNorm and RMSNorm over the last dim (C) of N rows. Forward caches per-row statistics.
//
// LayerNorm:  mean = Σx/C; var = Σ(x-mean)²/C (two-pass: the one-pass E[x²]-E[x]² cancels);
//             rstd = 1/sqrt(var + eps); out = (x - mean)·rstd·weight + bias
// RMSNorm:    rstd = 1/sqrt(Σx²/C + eps); out = x·rstd·weight
// Exact evaluation order (fp32, one rounding per operation, no FMA outside the reduction chains):
//   LayerNorm  m = Σx / C;  d = x - m;  var = Σ d·d / C;  r = 1 / sqrt(var + eps);
//              out = ((d·r)·w) + b
//   RMSNorm    r = 1 / sqrt(Σ x·x / C + eps);  out = (x·r)·w
// Canonical: Σx is canonical_sum over C, Σd·d and Σx·x are canonical_dot (FMA chains, chunks of
// 64, exact combine, one rounding); C is converted to fp32 exactly (C < 2^24). Fast: the same
// expressions, row sums in any order.
// Backward (xhat = (x - m)·r for LayerNorm, x·r for RMSNorm, both as in the forward; wd = w·dout):
//   dinp[n,:]  += r·((wd - mean_wd) - xhat·mean_wdx)                        (LayerNorm)
//   dinp[n,:]  += r·(wd - xhat·mean_wdx)                                    (RMSNorm)
//     with mean_wd = canonical_sum(wd)/C and mean_wdx = canonical_dot(wd, xhat)/C per row
//   dweight[c] += Σ over tokens of dout·xhat (FMA chain), dbias[c] += Σ over tokens of dout
//                 (plain-add chain); token chunks of 64 from token_offset, as in linear.hpp;
//                 token_offset % 64 != 0 is refused in canonical mode (ConfigError)
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep {

struct NormShape {
  int64_t N;  // rows
  int64_t C;  // normalised dim
  float eps = 1e-5f;
  // The forward's out rounded to bf16 (cast.hpp's round_to_bf16) after the expression above, as it
  // is stored: the input of a bf16 linear, without a pass over it afterwards.
  bool round_bf16 = false;
};

}  // namespace lockstep

namespace lockstep::cpu {

void layernorm_forward(Mode mode, NormShape s,
                       float* out, float* mean, float* rstd,      // (N, C) (N) (N)
                       const float* inp,                          // (N, C)
                       const float* weight, const float* bias);   // (C) (C)

void layernorm_backward(Mode mode, NormShape s, int64_t token_offset,
                        float* dinp,                              // (N, C) +=
                        GradSink dweight, GradSink dbias,         // (C) (C) +=
                        const float* dout,                        // (N, C)
                        const float* inp, const float* weight,    // (N, C) (C)
                        const float* mean, const float* rstd);    // (N) (N)

void rmsnorm_forward(Mode mode, NormShape s,
                     float* out, float* rstd,                     // (N, C) (N)
                     const float* inp, const float* weight);      // (N, C) (C)

void rmsnorm_backward(Mode mode, NormShape s, int64_t token_offset,
                      float* dinp,                                // (N, C) +=
                      GradSink dweight,                           // (C) +=
                      const float* dout,                          // (N, C)
                      const float* inp, const float* weight,      // (N, C) (C)
                      const float* rstd);                         // (N)

}  // namespace lockstep::cpu
