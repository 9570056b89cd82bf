// Content hashes: xxh64 over bytes, one-shot and streaming, and their hex form.
// Used for checkpoint manifests, model hashes and tensor dumps. Not cryptographic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct XXH64_state_s;

namespace lockstep {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);

// 16 lowercase hex digits, most significant first.
std::string hex64(uint64_t h);

// Streaming xxh64: the digest of the concatenation of every update().
class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  XXH64_state_s* state_;
};

}  // namespace lockstep
