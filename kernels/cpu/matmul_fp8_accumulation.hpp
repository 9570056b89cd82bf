// Matrix products under the emulated Hopper FP8 accumulator (kernels/ops/fp8_accumulation.hpp):
// each element's dot product by that header's model, eight output columns at a time in AVX2
// double lanes (each lane one element's whole accumulator, so the lanes and the OpenMP threads,
// which take rows and column blocks, do not change the bits). A promotion interval with a
// non-finite product, and the columns of a block narrower than eight, run the header's scalar
// model. Not here: the fp32-accumulating products (matmul.hpp).
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep::cpu {

// Where the product goes. One of:
//   f32     C[m·ldc + n] = dot (+ col_bias[n], one fp32 add; rounded to bf16 if round_bf16), or
//           with `onto` C += dot (one fp32 add: a weight gradient's beta = 1);
//   exact   each promotion interval's partial added to exact->add(offset + m·N + n) (canonical
//           weight gradients and tensor-parallel partials, combined and rounded by the caller).
struct Fp8HopperOutput {
  float* f32 = nullptr;
  int64_t ldc = 0;
  const float* col_bias = nullptr;
  bool round_bf16 = false;
  bool onto = false;
  ExactAccumulator* exact = nullptr;
  int64_t offset = 0;
};

// C = A·B, A (M×K) at A[m·sam + k·sak], B (K×N) at B[k·sbk + n·sbn] (a B with sbn ≠ 1 is packed
// into a buffer of the calling thread first); canonical mode combines the partials of an f32
// output exactly, fast mode promotes them in fp32 (the exact output is canonical's).
void matmul_fp8_hopper(Mode mode, int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak,
                       const float* B, int64_t sbk, int64_t sbn, const Fp8HopperOutput& out);

}  // namespace lockstep::cpu
