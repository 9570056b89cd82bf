// The detectors' content hash of a large buffer: XXH3 (64-bit) of each 1 MiB block, the blocks
// hashed in parallel (OpenMP, the run's threads), then XXH3 of the block hashes in order. A function of the
// bytes alone — the same on every rank whatever its thread count — that changes with any bit of
// them, and as fast as the memory lets the threads read.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::detect {

uint64_t block_hash(const void* data, size_t bytes);

}  // namespace lockstep::detect
