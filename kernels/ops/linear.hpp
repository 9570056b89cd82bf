// Linear layer: out = inp · weightᵀ + bias, weight stored (OC, IC) as in PyTorch and llm.c.
//
// Accumulation contract (canonical):
//   out[n,o]     = canonical_dot over i in [0,IC) of inp[n,i]·weight[o,i], then + bias[o] (one
//                  fp32 add after the rounded dot; no bias when bias == nullptr)
//   dinp[n,i]    = canonical_dot over o in [0,OC) of dout[n,o]·weight[o,i]   (overwritten)
//   dweight[o,i] += Σ over tokens n of dout[n,o]·inp[n,i]: chunks of 64 tokens counted from the
//                  start of the step's global batch (`token_offset` is this call's first global
//                  token); one FMA chain per chunk; each chunk partial added to the GradSink
//   dbias[o]    += Σ over tokens n of dout[n,o], same chunking (plain-add chain)
// Fast: one GEMM per output (sgemm_threads: OpenBLAS or Lockstep's fast GEMM): out onto a copy of
// the bias (beta = 1), dinp with beta = 0, dweight with beta = 1; dbias a sum per column.
//
// Tensor-parallel pieces (canonical only): a rank that holds a slice of the reduced index (the
// input features of a row-parallel layer, the output features of a column-parallel one) computes
// the very chunk partials the unsplit op would, and adds them to one exact sum per output element
// instead of rounding; the caller combines the ranks' exact sums and rounds once, which gives the
// unsplit op's bits. The slice must start on a global chunk boundary (a multiple of 64).
//   linear_forward_partials:       out[n,o]  += Σ over this slice's chunks of inp[n,i]·weight[o,i]
//                                  (no bias: it is added once, after the rounding)
//   linear_backward_dinp_partials: dinp[n,i] += Σ over this slice's chunks of dout[n,o]·weight[o,i]
//
// Accumulation::kHopperFp8 (the GEMMs of an fp8 linear that asks for it): every dot product above
// — out, dinp, dweight over tokens, the partials — runs the emulated tensor-core accumulator of
// fp8_accumulation.hpp instead of the chunked fp32 chains: promotion intervals of 128 take the
// place of the chunks of 64 (token_offset and the partials' slices must start on a multiple of
// 128); the bias and the bias gradient are as above.
#pragma once

#include <cstdint>

#include "kernels/ops/fp8_accumulation.hpp"
#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep {

struct LinearShape {
  int64_t N;   // rows (tokens)
  int64_t IC;  // input features
  int64_t OC;  // output features
  // kBf16: inp, weight and dout hold bf16 values (mode.hpp); the contract above is unchanged.
  Operands operands = Operands::kFp32;
  // out and dinp rounded to bf16 (cast.hpp's round_to_bf16) after the contract above, bias
  // included: fast mode rounds as its GEMM stores them. The partials ops take no rounding (their
  // sums are rounded once combined).
  bool round_outputs = false;
  // The backward ops read round_to_bf16(dout) wherever the contract above reads dout (a bf16
  // linear's output gradient, which the caller keeps in fp32): rounded as the products pack it
  // where they can, else into a copy first. dout itself is not written.
  bool round_dout = false;
  // Every op reads round_to_bf16(weight) wherever the contract above reads weight (a bf16 linear's
  // fp32 master weight, of which fast mode keeps no bf16 copy): rounded as fast mode's products
  // pack it where they can, else into a copy first. weight itself is not written.
  bool round_weight = false;
  Accumulation accumulation = Accumulation::kFp32;
};

// The shape of a product whose results are rounded later, if at all: after a sum across ranks, a
// check of the unrounded product.
inline LinearShape unrounded(LinearShape s) {
  s.round_outputs = false;
  return s;
}

}  // namespace lockstep

namespace lockstep::cpu {

void linear_forward(Mode mode, LinearShape s,
                    float* out,                                  // (N, OC)
                    const float* inp,                            // (N, IC)
                    const float* weight,                         // (OC, IC)
                    const float* bias);                          // (OC) or nullptr

void linear_backward(Mode mode, LinearShape s, int64_t token_offset,
                     float* dinp,                                // (N, IC) =, or nullptr
                     GradSink dweight,                           // (OC, IC) +=
                     GradSink dbias,                             // (OC) +=, or empty
                     const float* dout,                          // (N, OC)
                     const float* inp,                           // (N, IC)
                     const float* weight);                       // (OC, IC)

void linear_forward_partials(LinearShape s,
                             ExactAccumulator& out,              // (N, OC) +=
                             const float* inp,                   // (N, IC) this rank's IC slice
                             const float* weight);               // (OC, IC) this rank's columns

void linear_backward_dinp_partials(LinearShape s,
                                   ExactAccumulator& dinp,       // (N, IC) +=
                                   const float* dout,            // (N, OC) this rank's OC slice
                                   const float* weight);         // (OC, IC) this rank's rows

// Whether the ops read the operands that round_dout and round_weight ask for rounded as their
// products pack them (fast mode's products on the VDPBF16PS build), not through a rounded copy.
bool linear_rounds_as_read(Mode mode, Operands operands, Accumulation accumulation);

}  // namespace lockstep::cpu
