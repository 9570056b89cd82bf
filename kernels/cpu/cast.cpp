// Rounding to bf16 on the CPU (contract in kernels/ops/cast.hpp): on the fp32 bits, adding
// 0x7fff plus the lowest kept bit rounds to nearest even, a carry running into the exponent where
// the value rounds up to the next binade or to infinity; independent elements over the threads.
#include "kernels/ops/cast.hpp"

#include <bit>

namespace lockstep::cpu {

void round_to_bf16(int64_t n, float* out, const float* inp) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(inp[i]);
    const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    out[i] = std::bit_cast<float>(nan ? (b & 0x80000000u) | 0x7fc00000u : rounded);
  }
}

}  // namespace lockstep::cpu
