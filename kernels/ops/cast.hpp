// Rounding to bf16 in place of storing it: out[i] = inp[i] rounded to the nearest bf16 value,
// held in fp32 (the low 16 bits zero). The precision recipes (src/model/precision.hpp) put it
// where a bf16 run stores a tensor in bf16 or feeds it to a bf16 GEMM; the GEMM itself then runs
// the fp32 chains of its own contract on these values, and a bf16 × bf16 product is exact in
// fp32, so the result is what a bf16-input GEMM with fp32 accumulation computes.
//
// Contract (both modes; one rounding per element, no reduction): round to nearest, ties to even;
// subnormals kept (bf16 has fp32's exponent range: its subnormals are fp32 subnormals, rounded
// like any other value, never flushed); a finite value at or above bf16's largest finite
// 0x1.fep127 plus half its ulp becomes ±inf (IEEE overflow); ±inf stay; NaN becomes the quiet NaN
// 0x7fc00000 with the input's sign (src/core/formats.hpp's bf16_from_f32, bit for bit). out may
// alias inp.
//
// Stochastic rounding to bf16 (bf16 parameters: [train] master_weights = false): out[i] = inp[i]
// rounded to one of its two neighbouring bf16 values, up (away from zero) with probability
// (|x| − down)/(up − down), so that E[out] = x; the random word of element i is
// sr_bits(key.seed, key.tensor, key.step, first_index + i) (src/core/philox.hpp), and the rounding
// is src/core/formats.hpp's bf16_from_f32_sr on it, bit for bit: the top 16 random bits added to
// the 16 bits that bf16 drops, the carry kept. Zeros and ±inf stay, NaN becomes the quiet NaN with
// its sign, a finite value above bf16's largest may become ±inf. The bits depend on the element's
// global index only, never on how a caller splits a tensor (ranks, shards, threads). out may alias
// inp.
#pragma once

#include <cstdint>

namespace lockstep {

// The stream of an op's random words (src/core/philox.hpp's sr_bits fields).
struct StochasticKey {
  uint64_t seed = 0;
  uint32_t tensor = 0;  // the tensor's position in the model's canonical layout
  uint32_t step = 0;    // the optimizer step (1-based)
};

}  // namespace lockstep

namespace lockstep::cpu {

void round_to_bf16(int64_t n,
                   float* out,          // (n)
                   const float* inp);   // (n)

void round_to_bf16_stochastic(int64_t n, StochasticKey key,
                              int64_t first_index,          // global index of element 0
                              float* out,                   // (n)
                              const float* inp);            // (n)

}  // namespace lockstep::cpu
