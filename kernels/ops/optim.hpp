// AdamW and gradient-norm clipping, elementwise over flat fp32 buffers.
//
// AdamW (decoupled weight decay, Loshchilov & Hutter), per element, in this order, fp32, one
// rounding per operation, no FMA, IEEE sqrt and division (1 - beta computed once in fp32):
//   m = beta1·m + (1 - beta1)·g
//   v = beta2·v + (1 - beta2)·(g·g)
//   mhat = m / bc1,  vhat = v / bc2       (bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, given as fp32)
//   p = p - lr·(mhat / (sqrt(vhat) + eps) + wd·p)
// No reductions: identical bits in both modes (fast mode may vectorise freely; with
// -ffp-contract=off the result is the same).
//
// Gradient norm: sumsq = Σ g² over every element of every tensor, each tensor reduced by
// canonical_dot(g, g) chunking (chunks of 64 from the tensor's first element), all chunk partials
// of all tensors combined exactly, rounded once. Fast mode: any order (double accumulation,
// rounded to fp32 once per call before it reaches the combiner).
#pragma once

#include <cstdint>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/mode.hpp"

namespace lockstep {

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bc1, bc2;  // bias corrections 1 - beta^t, computed by the caller
};

}  // namespace lockstep

namespace lockstep::cpu {

void adamw_update(int64_t n, AdamWParams h,
                  float* param, float* m, float* v,               // (n) (n) (n) updated
                  const float* grad);                             // (n)

// Adds this buffer's chunk partials of Σ g² into `acc` (exact); the caller rounds once after the
// last tensor. Splitting a tensor between calls must fall on a multiple of 64 elements.
void grad_sumsq_accumulate(Mode mode, int64_t n, ChunkCombiner& acc, const float* grad);

// g = g · scale (fp32 multiply per element).
void scale_inplace(int64_t n, float* g, float scale);

}  // namespace lockstep::cpu
