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
#pragma once

#include <cstdint>

namespace lockstep::cpu {

void round_to_bf16(int64_t n,
                   float* out,          // (n)
                   const float* inp);   // (n)

}  // namespace lockstep::cpu
