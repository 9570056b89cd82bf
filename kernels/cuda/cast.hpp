// CUDA casts between fp32 arrays and bf16 / fp16 / fp8 E4M3 / fp8 E5M2 arrays.
//
// Every element goes through the same src/core/formats.hpp function the CPU uses, so a GPU cast
// equals the CPU cast bit for bit (tests/cuda/test_cast.cpp). Stochastic rounding draws the random
// word of element i from Philox keyed by (seed, tensor id, step) at the *global* element index
// first_index + i (src/core/philox.hpp): the bits do not depend on the launch shape, and a shard
// that starts at global index k gives the same bits as the whole tensor would.
// Not here: MX / blockwise scaling (the scale is applied by the caller), E8M0 arrays.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/core/dtype.hpp"
#include "src/core/formats.hpp"

namespace lockstep::cuda {

// The stochastic-rounding stream of one tensor at one step.
struct SrKey {
  uint64_t seed;
  uint32_t tensor_id;
  uint32_t step;
};

// Narrow formats these casts handle: kBF16, kF16 (stored as uint16_t), kE4M3, kE5M2 (uint8_t).
// `sat` selects the fp8 overflow rule; bf16 and fp16 follow IEEE (overflow -> ±inf) and ignore it.
// All pointers are device memory; the kernels are queued on `stream` and not waited for.

// out (n) of type `to` = RNE(in (n) fp32).
void cast_f32_to_rne(void* out, const float* in, int64_t n, DType to, Saturation sat,
                     cudaStream_t stream);

// out (n) of type `to` = stochastic rounding of in (n), element i with sr_bits(key..., first_index + i).
void cast_f32_to_sr(void* out, const float* in, int64_t n, DType to, Saturation sat, SrKey key,
                    uint64_t first_index, cudaStream_t stream);

// out (n) fp32 = exact widening of in (n) of type `from`.
void cast_to_f32(float* out, const void* in, int64_t n, DType from, cudaStream_t stream);

}  // namespace lockstep::cuda
