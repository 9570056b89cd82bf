// The one-device ops of modules.hpp: each one backend call.
#include "src/model/modules.hpp"

#include <algorithm>

namespace lockstep {

void activation_forward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t F, float* out,
                             const float* fc) {
  if (layer.ffn == FfnKind::kGelu) {
    be.gelu_forward(mode, rows * F, out, fc);
  } else {
    be.swiglu_forward(mode, rows, F, out, fc);
  }
}

void activation_backward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t F, float* dfc,
                              const float* fc, const float* dout) {
  if (layer.ffn == FfnKind::kGelu) {
    be.gelu_backward(mode, rows * F, dfc, fc, dout);
  } else {
    be.swiglu_backward(mode, rows, F, dfc, fc, dout);
  }
}

void norm_forward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, float* out, float* mean, float* rstd,
                       const float* inp, const float* w, const float* b, bool round_bf16) {
  const NormShape s{.N = rows, .C = layer.dims.C, .eps = layer.norm_eps, .round_bf16 = round_bf16};
  if (layer.norm == NormKind::kLayerNorm) {
    be.layernorm_forward(mode, s, out, mean, rstd, inp, w, b);
  } else {
    be.rmsnorm_forward(mode, s, out, rstd, inp, w);
  }
}

void norm_backward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t token_offset, float* dinp,
                        GradSink dw, GradSink db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd) {
  const NormShape s{rows, layer.dims.C, layer.norm_eps};
  if (layer.norm == NormKind::kLayerNorm) {
    be.layernorm_backward(mode, s, token_offset, dinp, dw, db, dout, inp, w, mean, rstd);
  } else {
    be.rmsnorm_backward(mode, s, token_offset, dinp, dw, dout, inp, w, rstd);
  }
}

int64_t seq_tokens(std::span<const SeqBlock> blocks) {
  int64_t n = 0;
  for (const SeqBlock& b : blocks) n += b.length;
  return n;
}

namespace {

// The sink's elements from `first` on (a block's rows of dwpe).
GradSink from(GradSink g, int64_t first) {
  if (g.empty()) return g;
  return {g.f32 != nullptr ? g.f32 + first : nullptr, g.exact, g.offset + first};
}

}  // namespace

void embedding_forward_blocks(Backend& be, Mode mode, EmbeddingShape s, std::span<const SeqBlock> seq, float* out,
                              const int32_t* tokens, const float* wte, const float* wpe) {
  int64_t row = 0;
  for (const SeqBlock& k : seq) {
    s.T = k.length;
    be.embedding_forward(mode, s, out + row * s.C, tokens + row, wte, wpe != nullptr ? wpe + k.position * s.C : nullptr);
    row += s.B * k.length;
  }
}

void embedding_backward_blocks(Backend& be, Mode mode, EmbeddingShape s, std::span<const SeqBlock> seq,
                               int64_t token_offset, GradSink dwte, GradSink dwpe, const float* dout,
                               const int32_t* tokens) {
  int64_t row = 0;
  for (const SeqBlock& k : seq) {
    s.T = k.length;
    be.embedding_backward(mode, s, token_offset + row, dwte, from(dwpe, k.position * s.C), dout + row * s.C,
                          tokens + row);
    row += s.B * k.length;
  }
}

namespace {

class Norm final : public NormOp {
 public:
  explicit Norm(const LayerDesc& layer) : layer_(layer) {}
  void forward(Backend& be, Mode mode, int64_t BT, float* out, float* mean, float* rstd, const float* inp, const float* w,
               const float* b, bool round_bf16) override {
    norm_forward_rows(be, layer_, mode, BT, out, mean, rstd, inp, w, b, round_bf16);
  }

 private:
  const LayerDesc& layer_;
};

class Linear final : public LinearOp {
 public:
  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w, const float* b) override {
    be.linear_forward(mode, s, out, inp, w, b);
  }
  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    be.linear_backward(mode, s, token_offset, dinp, dw, db, dout, inp, w);
  }
};

class Embedding final : public EmbeddingOp {
 public:
  explicit Embedding(const LayerDesc& layer) : layer_(layer) {}
  void forward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, float* out, const int32_t* tokens,
               const float* wte, const float* wpe) override {
    embedding_forward_blocks(be, mode, shape(B), seq, out, tokens, wte, wpe);
  }
  void backward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, int64_t token_offset, GradSink dwte,
                GradSink dwpe, const float* dout, const int32_t* tokens) override {
    embedding_backward_blocks(be, mode, shape(B), seq, token_offset, dwte, dwpe, dout, tokens);
  }

 private:
  EmbeddingShape shape(int64_t B) const { return {B, layer_.dims.T, layer_.dims.C, layer_.dims.V}; }
  const LayerDesc& layer_;
};

class Attention final : public AttentionOp {
 public:
  void forward(Backend& be, Mode mode, AttentionShape s, float* out, float* att, const float* qkv) override {
    be.attention_forward(mode, s, out, att, qkv);
  }
  void backward(Backend& be, Mode mode, AttentionShape s, float* dqkv, float* scratch, const float* dout,
                const float* qkv, const float* att) override {
    be.attention_backward(mode, s, dqkv, scratch, dout, qkv, att);
  }
};

class CrossEntropy final : public LossOp {
 public:
  explicit CrossEntropy(const LayerDesc& layer) : V_(layer.dims.V) {}
  void forward(Backend& be, Mode mode, int64_t N, float* losses, float* logits, const int32_t* targets, float dloss,
               bool backward) override {
    if (backward) {
      be.crossentropy_forward_backward(mode, {N, V_}, dloss, losses, logits, targets);
    } else {
      be.crossentropy_forward(mode, {N, V_}, losses, logits, targets);
    }
  }

 private:
  int64_t V_;
};

}  // namespace

std::unique_ptr<NormOp> ModelPlan::norm(const LayerDesc& layer) const { return std::make_unique<Norm>(layer); }

std::unique_ptr<LinearOp> ModelPlan::linear(const LayerDesc&, const ParamTensor&, LinearRows) const {
  return std::make_unique<Linear>();
}

void ModelPlan::gather_stream(const float* stream, float* all, int64_t BT, int64_t C) const {
  std::copy_n(stream, BT * C, all);
}

void ModelPlan::gather_positions(const float* local, float* whole, int64_t B, int64_t T, int64_t width) const {
  std::copy_n(local, B * T * width, whole);
}

std::unique_ptr<EmbeddingOp> ModelPlan::embedding(const LayerDesc& layer) const {
  return std::make_unique<Embedding>(layer);
}

std::unique_ptr<AttentionOp> ModelPlan::attention(const LayerDesc&) const { return std::make_unique<Attention>(); }

std::unique_ptr<LossOp> ModelPlan::loss(const LayerDesc& layer) const { return std::make_unique<CrossEntropy>(layer); }

}  // namespace lockstep
