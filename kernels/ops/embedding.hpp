// Token and position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
//
// Forward: one fp32 add per element (no wpe: a copy; rotary positions live in attention).
// Backward (parameter gradients, token reductions as in linear.hpp):
//   dwte[v,c] += Σ over tokens n with tokens[n] == v of dout[n,c]
//   dwpe[t,c] += Σ over tokens n at position t of dout[n,c]
// each a chain over the contributing tokens in increasing global token index inside each chunk of
// 64 global token indices (token_offset = global index of this call's first token), chunk
// partials added to the GradSink (a row or position with no token in a chunk adds nothing).
// token_offset % 64 != 0 is refused in canonical mode (ConfigError); a call holds whole sequences,
// so position = (index within the call) % T. Fast mode: `+=` per token into the fp32 gradient.
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep::cpu {

struct EmbeddingShape {
  int64_t B, T, C, V;
};

// Tokens outside [0, V) are an error (ConfigError naming the token and position).
void embedding_forward(Mode mode, EmbeddingShape s,
                       float* out,                                // (B, T, C)
                       const int32_t* tokens,                     // (B, T)
                       const float* wte,                          // (V, C)
                       const float* wpe);                         // (T, C) or nullptr

void embedding_backward(Mode mode, EmbeddingShape s, int64_t token_offset,
                        GradSink dwte,                            // (V, C) +=
                        GradSink dwpe,                            // (T, C) += or empty
                        const float* dout,                        // (B, T, C)
                        const int32_t* tokens);                   // (B, T)

}  // namespace lockstep::cpu
