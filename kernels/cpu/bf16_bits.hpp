// The bf16 roundings of kernels/ops/cast.hpp on an fp32 value's bits, for every CPU kernel that
// rounds to bf16 (cast.cpp's passes, the GEMM that rounds as it stores: matmul.isa.cpp, whose
// vector lanes follow the same steps). To nearest even: add 0x7fff plus the lowest kept bit and
// drop the low half — a carry runs into the exponent where the value rounds up to the next binade
// or to infinity. Stochastically: add the random word's top half instead, which carries with
// probability (dropped part) / 2^16. A NaN becomes the quiet NaN with its sign.
#pragma once

#include <bit>
#include <cstdint>

namespace lockstep::cpu {

inline uint32_t bf16_nan_or(uint32_t b, uint32_t rounded) {
  return (b & 0x7fffffffu) > 0x7f800000u ? (b & 0x80000000u) | 0x7fc00000u : rounded;
}

inline uint32_t bf16_nearest_bits(uint32_t b) { return bf16_nan_or(b, (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u); }

// x rounded to bf16 to nearest even, held in fp32.
inline float bf16_nearest(float x) { return std::bit_cast<float>(bf16_nearest_bits(std::bit_cast<uint32_t>(x))); }

inline uint32_t bf16_stochastic_bits(uint32_t b, uint32_t random) {
  return bf16_nan_or(b, (b + (random >> 16)) & 0xffff0000u);
}

}  // namespace lockstep::cpu
