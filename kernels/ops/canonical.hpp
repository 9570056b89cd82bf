// The canonical accumulation contract, as executable scalar code.
//
// Every reduction in canonical mode — dot products over K, weight gradients over tokens, sums over
// the vocabulary or the keys, norms over parameters — runs like this:
//
//   1. the index range [0, n) is cut into chunks of kCanonicalChunk consecutive indices, counted
//      from the start of the *global* range (the last chunk may be shorter);
//   2. inside a chunk: one sequential fp32 chain starting from +0.0f, in increasing index order,
//      `acc = fmaf(a[i], b[i], acc)` for products, `acc = acc + x[i]` for plain sums;
//   3. across chunks: the exact sum of the chunk partials (src/core/exact_sum.hpp), rounded once
//      to fp32 with round-to-nearest-even.
//
// Step 3 makes the result independent of how chunks are distributed over threads, SIMD lanes,
// micro-batches, TP/SP shards or DP ranks, provided every split falls on a chunk boundary; step 2
// makes a chunk's value independent of the vector width (SIMD kernels run one chain per lane, one
// lane per output element). This file is the specification the SIMD kernels and the emulated
// reference must match bit for bit; it is also the slow path kernels use for edge cases.
#pragma once

#include <cmath>
#include <cstdint>

#include "src/core/exact_sum.hpp"
#include "src/core/host_device.hpp"

namespace lockstep {

inline constexpr int64_t kCanonicalChunk = 64;

// Sequential fp32 FMA chain over one chunk: Σ a[i*sa] * b[i*sb], i in [0, n).
LS_HOST_DEVICE inline float chunk_dot(const float* a, int64_t sa, const float* b, int64_t sb,
                                      int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i * sa], b[i * sb], acc);
  return acc;
}

// Sequential fp32 chain of additions over one chunk.
LS_HOST_DEVICE inline float chunk_sum(const float* x, int64_t sx, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = acc + x[i * sx];
  return acc;
}

// Combines chunk partials exactly; the caller rounds once at the end with finish().
struct ChunkCombiner {
  double sum = 0.0;
  bool spilled = false;
  SuperAccumulator acc;

  LS_HOST_DEVICE void add(float partial) {
    if (!spilled && add_exact(sum, partial)) return;
    if (!spilled) {
      acc.add(sum);
      spilled = true;
    }
    acc.add(partial);
  }
  LS_HOST_DEVICE float finish() const {
    return spilled ? acc.round_to_float() : static_cast<float>(sum);
  }
};

// Canonical dot product of length n with strides: the whole contract in one function.
LS_HOST_DEVICE inline float canonical_dot(const float* a, int64_t sa, const float* b, int64_t sb,
                                          int64_t n) {
  ChunkCombiner c;
  for (int64_t k0 = 0; k0 < n; k0 += kCanonicalChunk) {
    const int64_t len = n - k0 < kCanonicalChunk ? n - k0 : kCanonicalChunk;
    c.add(chunk_dot(a + k0 * sa, sa, b + k0 * sb, sb, len));
  }
  return c.finish();
}

// Canonical sum of length n with stride.
LS_HOST_DEVICE inline float canonical_sum(const float* x, int64_t sx, int64_t n) {
  ChunkCombiner c;
  for (int64_t k0 = 0; k0 < n; k0 += kCanonicalChunk) {
    const int64_t len = n - k0 < kCanonicalChunk ? n - k0 : kCanonicalChunk;
    c.add(chunk_sum(x + k0 * sx, sx, len));
  }
  return c.finish();
}

}  // namespace lockstep
