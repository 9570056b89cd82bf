// The small GPT the gradient-bucket and ZeRO-2 tests build their parameter layouts and models
// from: two layers, two heads, a vocabulary of 96, so that every tensor is small and odd-sized
// next to the 64-element chunks.
#pragma once

#include "src/model/config.hpp"

namespace lockstep::parallel {

inline ModelConfig small_model(bool tied, PosKind pos = PosKind::kLearned) {
  ModelConfig m;
  m.vocab_size = 96;
  m.seq_len = 64;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.pos = pos;
  m.tie_embeddings = tied;
  return m;
}

}  // namespace lockstep::parallel
