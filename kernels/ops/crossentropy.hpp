// Softmax cross-entropy over the vocabulary, fused with its backward (as in llm.c: the full
// probability matrix is never stored; dlogits overwrites logits).
//
// Per row n with target y:  m = max_v logits[v];  Z = canonical_sum over v of exp(logits[v] - m)
//   losses[n]     = (m + log(Z)) - logits[y]
//   dlogits[n, v] = (exp(logits[v] - m) / Z - [v == y]) · dloss
// dloss is the loss's gradient scale (1 / tokens in the global batch for a mean loss).
// Canonical: exp/log from transcendental.hpp; sums chunked and exact as in canonical.hpp.
// Targets outside [0, V) are an error.
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep::cpu {

struct CrossEntropyShape {
  int64_t N;  // rows (tokens)
  int64_t V;  // vocabulary
};

void crossentropy_forward_backward(Mode mode, CrossEntropyShape s, float dloss,
                                   float* losses,                 // (N)
                                   float* logits,                 // (N, V) in: logits, out: dlogits
                                   const int32_t* targets);       // (N)

// Forward only (evaluation): losses[n] as above; logits untouched.
void crossentropy_forward(Mode mode, CrossEntropyShape s,
                          float* losses,                          // (N)
                          const float* logits,                    // (N, V)
                          const int32_t* targets);                // (N)

}  // namespace lockstep::cpu
