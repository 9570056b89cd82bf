// Internal helpers of the CPU kernels for parameter-gradient reductions over tokens.
//
// The canonical contract for a parameter gradient (kernels/ops/linear.hpp, canonical.hpp): tokens
// are cut into chunks of kCanonicalChunk *global* token indices; inside a chunk one fp32 chain per
// parameter element over the contributing tokens in increasing index order, starting from +0.0f;
// each chunk partial is added to the element's exact accumulator (GradSink::exact). A call covers
// global tokens [token_offset, token_offset + N) and token_offset must be a multiple of the chunk,
// so the call's local chunks are exactly the global ones and two calls never share a chunk.
// Fast mode: one fp32 chain per element over all of the call's tokens, then one `+=` into
// GradSink::f32.
//
// Threads split the parameter elements (columns), never the tokens: every element's chain runs on
// one thread, so the bits do not depend on the thread count.
//
// Not here: the row reductions of the ops (canonical_sum / canonical_dot) and the grouped
// reductions of the embedding (kernels/cpu/embedding.cpp).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/mode.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu::detail {

// A split of the tokens between calls must fall on a chunk boundary (docs/numerics.md, "The canonical contract": a split that
// would cut a chunk is refused).
inline void require_token_offset(Mode mode, int64_t token_offset, const char* op) {
  LS_REQUIRE(token_offset >= 0, op, ": token_offset (", token_offset, ") must be >= 0");
  if (mode == Mode::kCanonical) {
    LS_REQUIRE(token_offset % kCanonicalChunk == 0, op, ": token_offset (", token_offset,
               ") must be a multiple of the canonical chunk (", kCanonicalChunk,
               "): a split of the tokens between calls may not cut a chunk");
  }
}

// A non-empty sink must be the one the mode writes to and cover `count` elements.
inline void check_grad_sink(Mode mode, const GradSink& sink, int64_t count, const char* what) {
  if (sink.empty()) return;
  if (mode == Mode::kCanonical) {
    LS_CHECK(sink.exact != nullptr, what, ": canonical mode needs an exact GradSink");
    LS_CHECK(sink.offset >= 0 && static_cast<size_t>(sink.offset + count) <= sink.exact->size(),
             what, ": GradSink range [", sink.offset, ", ", sink.offset + count,
             ") exceeds its accumulator of ", sink.exact->size(), " elements");
  } else {
    LS_CHECK(sink.f32 != nullptr, what, ": fast mode needs an fp32 GradSink");
  }
}

// Columns per inner block: the chains of one block run side by side (one per column, so the
// compiler may vectorise across columns without changing any chain).
inline constexpr int64_t kColumnBlock = 32;

// For every column c in [0, C): sink[c] += Σ over tokens n of the chain defined by `step`, where
// `acc = step(acc, n, c)` performs one link (`acc + x` for a plain sum, `fma(a, b, acc)` for a
// product). Chunking as described at the top of this file.
template <class Step>
void reduce_columns_over_tokens(Mode mode, int64_t N, int64_t C, const GradSink& sink, Step step) {
  if (sink.empty() || N == 0) return;
  const int64_t chunk = mode == Mode::kCanonical ? kCanonicalChunk : N;
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, C - c0);
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t n1 = std::min(n0 + chunk, N);
      float acc[kColumnBlock];
      for (int64_t j = 0; j < width; ++j) acc[j] = 0.0f;
      for (int64_t n = n0; n < n1; ++n) {
        for (int64_t j = 0; j < width; ++j) acc[j] = step(acc[j], n, c0 + j);
      }
      if (mode == Mode::kCanonical) {
        sink.exact->add_run(static_cast<size_t>(sink.offset + c0), acc, static_cast<size_t>(width));
      } else {
        for (int64_t j = 0; j < width; ++j) sink.f32[c0 + j] += acc[j];
      }
    }
  }
}

}  // namespace lockstep::cpu::detail
