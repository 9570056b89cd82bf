// Rounding to bf16 on the CPU (contract in kernels/ops/cast.hpp): the bit steps of bf16_bits.hpp,
// independent elements over the threads.
#include "kernels/ops/cast.hpp"

#include <algorithm>
#include <bit>

#include "kernels/cpu/bf16_bits.hpp"
#include "src/core/philox.hpp"

namespace lockstep::cpu {

void round_to_bf16(int64_t n, float* out, const float* inp) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(bf16_nearest_bits(std::bit_cast<uint32_t>(inp[i])));
}

namespace {

// Philox4x32-10 of kLanes consecutive blocks at once, lane by lane the rounds of
// src/core/philox.hpp written over arrays, which the compiler turns into vector code (32x32->64
// multiplies as VPMULUDQ): the same words as sr_block, word j of block g0 + l at out[4·l + j], in
// the order of the elements they serve.
constexpr int kLanes = 16;
void sr_blocks(StochasticKey key, uint64_t g0, uint32_t out[4 * kLanes]) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t g = g0 + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(g);
    c1[l] = static_cast<uint32_t>(g >> 32);
    c2[l] = key.tensor;
    c3[l] = key.step;
  }
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += detail::kPhiloxW0;
      k1 += detail::kPhiloxW1;
    }
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(detail::kPhiloxM0) * c0[l];
      const uint64_t p1 = static_cast<uint64_t>(detail::kPhiloxM1) * c2[l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    out[4 * l] = c0[l];
    out[4 * l + 1] = c1[l];
    out[4 * l + 2] = c2[l];
    out[4 * l + 3] = c3[l];
  }
}

}  // namespace

// Philox blocks serve four consecutive global indices; threads take whole groups of kLanes blocks,
// so each is drawn once. bf16_stochastic_bits is formats.hpp's stochastic narrowing for bf16,
// whose dropped part is always the low 16 bits.
void round_to_bf16_stochastic(int64_t n, StochasticKey key, int64_t first_index, float* out, const float* inp) {
  if (n <= 0) return;
  const int64_t g0 = (first_index >> 2) / kLanes * kLanes;   // first block of the first group
  const int64_t g1 = (first_index + n - 1) >> 2;             // last block
  const int64_t groups = (g1 - g0) / kLanes + 1;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 15))
  for (int64_t q = 0; q < groups; ++q) {
    const int64_t gq = g0 + q * kLanes;
    uint32_t words[4 * kLanes];
    sr_blocks(key, static_cast<uint64_t>(gq), words);
    const int64_t i0 = std::max<int64_t>(gq * 4 - first_index, 0);
    const int64_t i1 = std::min<int64_t>((gq + kLanes) * 4 - first_index, n);
    const int64_t shift = first_index - gq * 4;  // words[i + shift]: element i's word
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      out[i] = std::bit_cast<float>(bf16_stochastic_bits(std::bit_cast<uint32_t>(inp[i]), words[i + shift]));
    }
  }
}

}  // namespace lockstep::cpu
