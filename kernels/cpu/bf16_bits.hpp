// The bf16 roundings of kernels/ops/cast.hpp on an fp32 value's bits, for every CPU kernel that
// rounds to bf16 (cast.cpp's passes, the GEMM that rounds as it stores: matmul.isa.cpp, whose
// vector lanes follow the same steps). To nearest even: add 0x7fff plus the lowest kept bit and
// drop the low half — a carry runs into the exponent where the value rounds up to the next binade
// or to infinity. Stochastically: add the random word's top half instead, which carries with
// probability (dropped part) / 2^16. A NaN becomes the quiet NaN with its sign.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>

namespace lockstep::cpu {

inline uint32_t bf16_nan_or(uint32_t b, uint32_t rounded) {
  return (b & 0x7fffffffu) > 0x7f800000u ? (b & 0x80000000u) | 0x7fc00000u : rounded;
}

inline uint32_t bf16_nearest_bits(uint32_t b) { return bf16_nan_or(b, (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u); }

// x rounded to bf16 to nearest even, held in fp32.
inline float bf16_nearest(float x) { return std::bit_cast<float>(bf16_nearest_bits(std::bit_cast<uint32_t>(x))); }

// The same steps on a vector's lanes, for the kernels compiled with AVX2 (eight lanes) or AVX-512
// (sixteen; the zero-masked shift: GCC 12 warns -Wmaybe-uninitialized on the unmasked one).
#if defined(__AVX2__)
inline __m256 bf16_nearest8(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i rounded = _mm256_and_si256(up, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(static_cast<int>(0x80000000u))),
                                        _mm256_set1_epi32(0x7fc00000));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan));
}
#endif
#if defined(__AVX512F__)
inline __m512 bf16_nearest16(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, b, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i rounded = _mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m512i magnitude = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                                        _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, nan, quiet));
}
#endif

inline uint32_t bf16_stochastic_bits(uint32_t b, uint32_t random) {
  return bf16_nan_or(b, (b + (random >> 16)) & 0xffff0000u);
}

}  // namespace lockstep::cpu
