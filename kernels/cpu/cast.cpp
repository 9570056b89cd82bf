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
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_nearest(inp[i]);
}

namespace {

// The Philox words of kLanes consecutive blocks (src/core/philox.hpp's sr_block), word j of block
// g0 + l at out[4·l + j], in the order of the elements they serve; a loop over blocks the compiler
// turns into vector code (the rounds' 32x32->64 multiplies as VPMULUDQ).
constexpr int kLanes = 16;
void sr_blocks(StochasticKey key, uint64_t g0, uint32_t out[4 * kLanes]) {
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) {
    const PhiloxBlock b = sr_block(key.seed, key.tensor, key.step, g0 + static_cast<uint64_t>(l));
    for (int j = 0; j < 4; ++j) out[4 * l + j] = b.v[j];
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
