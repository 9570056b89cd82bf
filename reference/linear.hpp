// Reference linear layer: out = inp · weightᵀ + bias, weight stored (OC, IC) — the contract of
// kernels/ops/linear.hpp in plain single-threaded loops over a generic scalar Real (double, an MPFR
// number, Bounded<T>). Every reduction goes through reference/reduce.hpp, so Real = Bounded<T>
// yields bounds valid for any summation order (fast mode, canonical chunks, split-K).
//
// dinp is overwritten. Parameter gradients (dweight, dbias) go through GradOut sinks
// (reference/reduce.hpp): `+=` for plain pointers, exact accumulation of token-chunk partials for
// a canonical-mode sink (reference/canonical_f32.hpp), as the kernels' GradSink.
// `accumulation`: how the products accumulate (reference/fp8_accumulation.hpp: an fp8 GEMM may
// ask for the Hopper accumulator); the bias and its gradient are plain.
// Not here: the canonical order itself (kernels/ops/canonical.hpp), any threading or SIMD.
#pragma once

#include <cstdint>
#include <type_traits>

#include "reference/fp8_accumulation.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

template <class Real>
void linear_forward(int64_t N, int64_t IC, int64_t OC,
                    Real* out,           // (N, OC)
                    const Real* inp,     // (N, IC)
                    const Real* weight,  // (OC, IC)
                    const Real* bias,    // (OC) or nullptr
                    Accumulation accumulation = Accumulation::kFp32) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      Real v = dot_accumulated(accumulation, inp + n * IC, 1, weight + o * IC, 1, IC);
      if (bias != nullptr) v = v + bias[o];
      out[n * OC + o] = v;
    }
  }
}

// forward: out[n,o] = Σ_i inp[n,i]·weight[o,i] + bias[o]
//   dinp[n,i]     = Σ_o dout[n,o]·weight[o,i]
//   dweight[o,i] += Σ_n dout[n,o]·inp[n,i]
//   dbias[o]     += Σ_n dout[n,o]
template <class Real>
void linear_backward(int64_t N, int64_t IC, int64_t OC,
                     Real* dinp,          // (N, IC) =, or nullptr
                     std::type_identity_t<GradOut<Real>> dweight,  // (OC, IC) +=, or nullptr
                     std::type_identity_t<GradOut<Real>> dbias,    // (OC) +=, or nullptr
                     const Real* dout,    // (N, OC)
                     const Real* inp,     // (N, IC)
                     const Real* weight,  // (OC, IC)
                     Accumulation accumulation = Accumulation::kFp32)
{
  if (dinp != nullptr) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < IC; ++i) {
        dinp[n * IC + i] = dot_accumulated(accumulation, dout + n * OC, 1, weight + i, IC, OC);
      }
    }
  }
  if (dweight) {
    for (int64_t o = 0; o < OC; ++o) {
      for (int64_t i = 0; i < IC; ++i) {
        grad_dot_accumulated(accumulation, dweight, o * IC + i, dout + o, OC, inp + i, IC, N);
      }
    }
  }
  if (dbias) {
    for (int64_t o = 0; o < OC; ++o) grad_sum(dbias, o, dout + o, OC, N);
  }
}

}  // namespace lockstep::reference
