// Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011) and the keyed stream that supplies the random bits of stochastic rounding.
//
// Philox is counter-based: the output is a pure function of (counter, key), so the bits an element
// receives depend only on its global index and never on threads, ranks or memory layout
// (docs/numerics.md, "Determinism"). Checked against Random123's known-answer vectors.
//
// Stochastic-rounding stream: key = seed (64 bits), counter = (global element index / 4 as 64 bits,
// tensor id, step). Every field goes into the (counter, key) pair unhashed, so distinct
// (seed, tensor, step, index) never share a Philox block; one block serves four consecutive
// elements (word index % 4), so a kernel can draw once per four elements.
// Not here: uniform floats, normals, dropout masks (they can be built on philox4x32_10).
#pragma once

#include <cstdint>

#include "src/core/host_device.hpp"

namespace lockstep {

struct PhiloxBlock {
  uint32_t v[4];
};

namespace detail {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // round multipliers
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3)-1)
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

LS_HOST_DEVICE inline PhiloxBlock philox_round(PhiloxBlock c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c.v[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c.v[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return PhiloxBlock{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
}

}  // namespace detail

// Ten rounds; the key is bumped by the Weyl constants between rounds.
LS_HOST_DEVICE inline PhiloxBlock philox4x32_10(PhiloxBlock counter, uint32_t key0, uint32_t key1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key0 += detail::kPhiloxW0;
      key1 += detail::kPhiloxW1;
    }
    counter = detail::philox_round(counter, key0, key1);
  }
  return counter;
}

// The block holding the random words of elements 4*group .. 4*group+3.
LS_HOST_DEVICE inline PhiloxBlock sr_block(uint64_t seed, uint32_t tensor_id, uint32_t step,
                                           uint64_t group) {
  const PhiloxBlock counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                             tensor_id, step}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// 32 uniform random bits for stochastic rounding of the element with this global index.
LS_HOST_DEVICE inline uint32_t sr_bits(uint64_t seed, uint32_t tensor_id, uint32_t step,
                                       uint64_t element_index) {
  return sr_block(seed, tensor_id, step, element_index >> 2).v[element_index & 3];
}

}  // namespace lockstep
