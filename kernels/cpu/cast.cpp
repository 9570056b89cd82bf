// Rounding to bf16 on the CPU (contract in kernels/ops/cast.hpp): on the fp32 bits, adding
// 0x7fff plus the lowest kept bit rounds to nearest even, a carry running into the exponent where
// the value rounds up to the next binade or to infinity; independent elements over the threads.
// Stochastic rounding likewise, with the random word's top half in place of 0x7fff.
#include "kernels/ops/cast.hpp"

#include <bit>

#include "src/core/philox.hpp"

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

// Philox blocks serve four consecutive global indices; threads take whole blocks, so each is drawn
// once. The rounding is the bit trick of formats.hpp's stochastic narrowing for bf16, where the
// dropped part is always the low 16 bits: adding the random word's top 16 bits to them carries into
// the kept bits with probability (dropped part) / 2^16, into the exponent (or to ±inf) by itself.
void round_to_bf16_stochastic(int64_t n, StochasticKey key, int64_t first_index, float* out, const float* inp) {
  if (n <= 0) return;
  const int64_t g0 = first_index >> 2, g1 = (first_index + n - 1) >> 2;  // blocks [g0, g1]
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 15))
  for (int64_t g = g0; g <= g1; ++g) {
    const PhiloxBlock r = sr_block(key.seed, key.tensor, key.step, static_cast<uint64_t>(g));
    for (int j = 0; j < 4; ++j) {
      const int64_t i = g * 4 + j - first_index;
      if (i < 0 || i >= n) continue;
      const uint32_t b = std::bit_cast<uint32_t>(inp[i]);
      const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
      const uint32_t rounded = (b + (r.v[j] >> 16)) & 0xffff0000u;
      out[i] = std::bit_cast<float>(nan ? (b & 0x80000000u) | 0x7fc00000u : rounded);
    }
  }
}

}  // namespace lockstep::cpu
