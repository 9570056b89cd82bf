#include "src/core/hash.hpp"

#include <xxhash.h>

#include <cstdio>

#include "src/core/check.hpp"

namespace lockstep {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed) { return XXH64(data, bytes, seed); }

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Hasher::Hasher(uint64_t seed) : state_(XXH64_createState()) {
  LS_CHECK(state_ != nullptr);
  XXH64_reset(state_, seed);
}

Hasher::~Hasher() { XXH64_freeState(state_); }

void Hasher::update(const void* data, size_t bytes) { XXH64_update(state_, data, bytes); }

uint64_t Hasher::digest() const { return XXH64_digest(state_); }

}  // namespace lockstep
