// Token and position embedding on the CPU, forward and backward, canonical and fast modes.
//
// Forward is one fp32 add per element (identical in both modes). Backward reduces dout over the
// tokens that share a vocabulary row (dwte) or a position (dwpe): in canonical mode, per chunk of
// kCanonicalChunk global tokens, one plain-add chain per (row, column) over the chunk's
// contributing tokens in increasing token order, each chunk partial added to the exact sink; in
// fast mode, `+=` straight into the fp32 gradient in token order.
// Threads split the columns C, never the tokens, so the bits do not depend on the thread count.
//
// A vocabulary-parallel shard (rows > 0) skips the tokens it does not hold (ops/embedding.hpp).
// Not here: the collective that combines the shards' outputs (src/parallel), rotary positions.
#include "kernels/ops/embedding.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>

#include "kernels/cpu/token_reduction.hpp"
#include "kernels/ops/canonical.hpp"

namespace lockstep::cpu {
namespace {

void check_shape(EmbeddingShape s, const char* op) {
  LS_REQUIRE(s.B >= 0 && s.T > 0 && s.C > 0 && s.V > 0, op,
             ": need B >= 0 and T, C, V > 0, got B=", s.B, " T=", s.T, " C=", s.C, " V=", s.V);
  LS_REQUIRE(s.rows >= 0 && s.rows_first >= 0 && s.rows_first + s.rows <= s.V, op, ": rows [", s.rows_first,
             ", ", s.rows_first + s.rows, ") outside the vocabulary [0, ", s.V, ")");
}

int64_t held_rows(EmbeddingShape s) { return s.rows > 0 ? s.rows : s.V; }

// Row of wte holding token `tok`, or -1 where this shard does not hold it.
int64_t held_row(EmbeddingShape s, int32_t tok) {
  const int64_t r = static_cast<int64_t>(tok) - s.rows_first;
  return r >= 0 && r < held_rows(s) ? r : -1;
}

// Every token must index a row of wte; the message names the first bad one.
void check_tokens(EmbeddingShape s, const int32_t* tokens, const char* op) {
  for (int64_t i = 0; i < s.B * s.T; ++i) {
    LS_REQUIRE(tokens[i] >= 0 && tokens[i] < s.V, op, ": token at position (b=", i / s.T,
               ", t=", i % s.T, ") is ", tokens[i], ", outside the vocabulary [0, ", s.V, ")");
  }
}

// This thread's share [c0, c1) of the columns; every column belongs to exactly one thread.
void thread_columns(int64_t C, int64_t& c0, int64_t& c1) {
  const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
  c0 = C * t / nt;
  c1 = C * (t + 1) / nt;
}

// The chains of tokens [n0, n0 + len) (len <= kCanonicalChunk) with equal keys, in token order:
// keys[k] is token n0 + k's key, next[k] the next k' > k with that key (-1: none), first[k]
// whether no earlier token has it. An open-addressing table of the chunk's keys (a pairwise scan
// evaluated len²/2 keys, each position key a division, and found no partner for most tokens).
template <class Key>
void link_chains(int64_t n0, int64_t len, Key key, int64_t* keys, int64_t* next, bool* first) {
  constexpr int kSlots = 2 * kCanonicalChunk;
  static_assert((kSlots & (kSlots - 1)) == 0, "the slot index is the hash's top bits");
  constexpr int kSlotBits = std::countr_zero(static_cast<unsigned>(kSlots));
  int64_t slot_key[kSlots], slot_last[kSlots];
  std::fill(slot_last, slot_last + kSlots, int64_t{-1});
  for (int64_t k = 0; k < len; ++k) {
    const int64_t kk = keys[k] = key(n0 + k);
    uint64_t h = (static_cast<uint64_t>(kk) * 0x9e3779b97f4a7c15ULL) >> (64 - kSlotBits);
    while (slot_last[h] >= 0 && slot_key[h] != kk) h = (h + 1) & (kSlots - 1);
    next[k] = -1;
    first[k] = slot_last[h] < 0;
    if (first[k]) {
      slot_key[h] = kk;
    } else {
      next[slot_last[h]] = k;
    }
    slot_last[h] = k;
  }
}

// sink[key(n) * C + c] += Σ over tokens n with that key of dout[n, c], for all keys and columns;
// tokens with a negative key (not held by this shard) add nothing.
// Canonical: inside each chunk of tokens, tokens with equal keys form one chain in increasing
// token order (next[] links each token to the next one with its key); each chain's value is one
// chunk partial. Fast: `+=` per token into the fp32 gradient.
template <class Key>
void reduce_grouped_over_tokens(Mode mode, int64_t N, int64_t C, const GradSink& sink,
                                const float* dout, Key key) {
  if (sink.empty() || N == 0) return;
#pragma omp parallel
  {
    int64_t c0, c1;
    thread_columns(C, c0, c1);
    if (mode == Mode::kFast) {
      for (int64_t n = 0; n < N; ++n) {
        if (key(n) < 0) continue;
        float* g = sink.f32 + key(n) * C;
        const float* dy = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) g[c] += dy[c];
      }
    } else {
      for (int64_t n0 = 0; n0 < N; n0 += kCanonicalChunk) {
        const int64_t len = std::min(kCanonicalChunk, N - n0);
        int64_t keys[kCanonicalChunk], next[kCanonicalChunk];
        bool first[kCanonicalChunk];
        link_chains(n0, len, key, keys, next, first);
        for (int64_t k = 0; k < len; ++k) {
          if (!first[k] || keys[k] < 0) continue;
          const size_t row = static_cast<size_t>(sink.offset + keys[k] * C);
          for (int64_t cb = c0; cb < c1; cb += detail::kColumnBlock) {
            const int64_t width = std::min(detail::kColumnBlock, c1 - cb);
            float acc[detail::kColumnBlock];
            for (int64_t j = 0; j < width; ++j) acc[j] = 0.0f;
            for (int64_t m = k; m >= 0; m = next[m]) {
              const float* dy = dout + (n0 + m) * C + cb;
              for (int64_t j = 0; j < width; ++j) acc[j] = acc[j] + dy[j];
            }
            sink.exact->add_run(row + static_cast<size_t>(cb), acc, static_cast<size_t>(width));
          }
        }
      }
    }
  }
}

}  // namespace

void embedding_forward(Mode mode, EmbeddingShape s, float* out, const int32_t* tokens,
                       const float* wte, const float* wpe) {
  check_shape(s, "embedding_forward");
  check_tokens(s, tokens, "embedding_forward");
  const int64_t C = s.C;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.B * s.T; ++i) {
    const int64_t row = held_row(s, tokens[i]);
    float* o = out + i * C;
    if (row < 0) {
      for (int64_t c = 0; c < C; ++c) o[c] = -0.0f;
      continue;
    }
    const float* e = wte + row * C;
    if (wpe == nullptr) {
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    } else {
      const float* p = wpe + (i % s.T) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void embedding_backward(Mode mode, EmbeddingShape s, int64_t token_offset, GradSink dwte,
                        GradSink dwpe, const float* dout, const int32_t* tokens) {
  check_shape(s, "embedding_backward");
  check_tokens(s, tokens, "embedding_backward");
  detail::require_token_offset(mode, token_offset, "embedding_backward");
  detail::check_grad_sink(mode, dwte, held_rows(s) * s.C, "embedding_backward dwte");
  detail::check_grad_sink(mode, dwpe, s.T * s.C, "embedding_backward dwpe");
  const int64_t N = s.B * s.T;
  // Forward: out[n,:] = wte[tokens[n],:] + wpe[n % T,:]  ->  dwte[tokens[n],:] += dout[n,:]
  reduce_grouped_over_tokens(mode, N, s.C, dwte, dout,
                             [&](int64_t n) { return held_row(s, tokens[n]); });
  //                                                        ->  dwpe[n % T,:] += dout[n,:]
  reduce_grouped_over_tokens(mode, N, s.C, dwpe, dout, [&](int64_t n) { return n % s.T; });
}

}  // namespace lockstep::cpu
