// Softmax cross-entropy over the vocabulary, fused with its backward (as in llm.c: the full
// probability matrix is never stored; dlogits overwrites logits).
//
// Per row n with target y:  m = max_v logits[v];  Z = canonical_sum over v of exp(logits[v] - m)
//   losses[n]     = (m + log(Z)) - logits[y]
//   dlogits[n, v] = (exp(logits[v] - m) / Z - [v == y]) · dloss
// dloss is the loss's gradient scale (1 / tokens in the global batch for a mean loss).
// Canonical: exp/log from transcendental.hpp; sums chunked and exact as in canonical.hpp.
// Targets outside [0, V) are an error.
//
// Vocabulary-parallel pieces (tensor parallelism): a rank holds the columns [v0, v0 + V) of rows
// V_total wide and never the whole row; the caller combines across ranks between the steps:
//   1. crossentropy_shard_max:       m[n] = max over the shard          -> max over the ranks
//      (the loop m = -inf; m = x > m ? x : m: NaN skipped; a row of NaN gives -inf, and its loss
//      is NaN all the same through the denominator)
//   2. crossentropy_shard_partition: Z[n] += the shard's part of Σ exp(logits − m): canonical, its
//      chunk partials (v0 must be a multiple of 64, so they are the unsplit op's chunks); fast, one
//      fp32 chain over the shard. target[n] = logits[n, y] where this rank holds y, else -0.0f
//      (the identity of fp32 addition: the sum over the ranks is exactly the owner's value)
//                                                                       -> exact sum of Z, sum of target
//   3. crossentropy_shard_finish:    losses (every rank) and the shard's dlogits from the formulas
//      above with the combined m, Z and logits[y]: canonical, the unsplit op's bits.
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep {

struct CrossEntropyShape {
  int64_t N;  // rows (tokens)
  int64_t V;  // vocabulary
};

struct CrossEntropyShard {
  int64_t N;        // rows (tokens)
  int64_t V;        // columns held by this rank
  int64_t v0;       // global index of the first of them
  int64_t V_total;  // the whole vocabulary (targets lie in [0, V_total))
};

}  // namespace lockstep

namespace lockstep::cpu {

void crossentropy_forward_backward(Mode mode, CrossEntropyShape s, float dloss,
                                   float* losses,                 // (N)
                                   float* logits,                 // (N, V) in: logits, out: dlogits
                                   const int32_t* targets);       // (N)

// Forward only (evaluation): losses[n] as above; logits untouched.
void crossentropy_forward(Mode mode, CrossEntropyShape s,
                          float* losses,                          // (N)
                          const float* logits,                    // (N, V)
                          const int32_t* targets);                // (N)

void crossentropy_shard_max(CrossEntropyShard s,
                            float* m,                             // (N)
                            const float* logits);                 // (N, V)

void crossentropy_shard_partition(Mode mode, CrossEntropyShard s,
                                  ExactAccumulator& Z,            // (N) +=
                                  float* target,                  // (N)
                                  const float* logits,            // (N, V)
                                  const float* m,                 // (N) global row max
                                  const int32_t* targets);        // (N)

// dlogits may be nullptr (forward only) or alias logits (in place).
void crossentropy_shard_finish(Mode mode, CrossEntropyShard s, float dloss,
                               float* losses,                     // (N)
                               float* dlogits,                    // (N, V) or nullptr
                               const float* logits,               // (N, V)
                               const float* m, const float* Z,    // (N) (N) global
                               const float* target,               // (N) logits[n, y], global
                               const int32_t* targets);           // (N)

}  // namespace lockstep::cpu
