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
//
// Vocabulary-parallel (tensor parallelism): with rows > 0, wte and dwte hold only the rows
// [rows_first, rows_first + rows) of the V-row table. Forward writes wte[token] + wpe[t] for the
// tokens in that range, exactly as above, and -0.0f for the others (the identity of fp32
// addition: a sum over the ranks of their outputs is exactly the owner's row, in any order);
// backward adds to dwte only for those tokens, and computes the whole dwpe.
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep {

struct EmbeddingShape {
  int64_t B, T, C, V;
  int64_t rows_first = 0;  // vocabulary-parallel shard: first row of wte held
  int64_t rows = 0;        // rows of wte held; 0: all V
};

}  // namespace lockstep

namespace lockstep::cpu {

// Tokens outside [0, V) are an error (ConfigError naming the token and position).
void embedding_forward(Mode mode, EmbeddingShape s,
                       float* out,                                // (B, T, C)
                       const int32_t* tokens,                     // (B, T)
                       const float* wte,                          // (V or rows, C)
                       const float* wpe);                         // (T, C) or nullptr

void embedding_backward(Mode mode, EmbeddingShape s, int64_t token_offset,
                        GradSink dwte,                            // (V or rows, C) +=
                        GradSink dwpe,                            // (T, C) += or empty
                        const float* dout,                        // (B, T, C)
                        const int32_t* tokens);                   // (B, T)

}  // namespace lockstep::cpu
