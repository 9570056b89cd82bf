// LayerNorm and RMSNorm over the last dim (C) of N rows. Forward caches per-row statistics.
//
// LayerNorm:  mean = Σx/C; var = Σ(x-mean)²/C (two-pass: the one-pass E[x²]-E[x]² cancels);
//             rstd = 1/sqrt(var + eps); out = (x - mean)·rstd·weight + bias
// RMSNorm:    rstd = 1/sqrt(Σx²/C + eps); out = x·rstd·weight
// Canonical: each row sum is canonical_sum / canonical_dot over C (chunks of 64, exact combine);
// divisions by C and 1/sqrt are single IEEE operations in fp32, in the order written above.
// Backward:
//   dinp[n,:]  += rstd·(w·dout - mean(w·dout) - xhat·mean(w·dout·xhat))     (LayerNorm)
//   dinp[n,:]  += rstd·(w·dout - xhat·mean(w·dout·xhat))                    (RMSNorm)
//   dweight[c] += Σ over tokens of dout·xhat, dbias[c] += Σ over tokens of dout
//                 (token chunks of 64 from token_offset, as in linear.hpp)
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep::cpu {

struct NormShape {
  int64_t N;  // rows
  int64_t C;  // normalised dim
  float eps = 1e-5f;
};

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
