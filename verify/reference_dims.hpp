// The reference model's dimensions (reference/gpt.hpp) for a trainer model config: the one place
// where verify/ translates src/model's ModelConfig into reference::GptDims.
#pragma once

#include "reference/gpt.hpp"
#include "src/model/config.hpp"

namespace lockstep::verify {

inline reference::GptDims reference_dims(const ModelConfig& m) {
  reference::GptDims d;
  d.V = m.vocab_size;
  d.T = m.seq_len;
  d.C = m.d_model;
  d.L = m.n_layers;
  d.NH = m.n_heads;
  d.NKV = m.n_kv_heads;
  d.F = m.ffn_width();
  d.swiglu = m.ffn == FfnKind::kSwiglu;
  d.rmsnorm = m.norm == NormKind::kRmsNorm;
  d.rope = m.pos == PosKind::kRope;
  d.tie_embeddings = m.tie_embeddings;
  d.bias = m.bias;
  d.norm_eps = m.norm_eps;
  return d;
}

}  // namespace lockstep::verify
