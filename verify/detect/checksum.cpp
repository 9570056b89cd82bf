#include "verify/detect/checksum.hpp"

#include <algorithm>
#include <vector>

// XXH3, inlined to be built for AVX2 (this file's flags): it reads at the memory's speed.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace lockstep::detect {

uint64_t block_hash(const void* data, size_t bytes) {
  constexpr size_t kBlock = size_t{1} << 20;
  const auto* p = static_cast<const unsigned char*>(data);
  const auto blocks = static_cast<int64_t>((bytes + kBlock - 1) / kBlock);
  std::vector<uint64_t> h(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t first = static_cast<size_t>(b) * kBlock;
    h[static_cast<size_t>(b)] = XXH3_64bits(p + first, std::min(kBlock, bytes - first));
  }
  return XXH3_64bits_withSeed(h.data(), h.size() * sizeof(uint64_t), bytes);
}

}  // namespace lockstep::detect
