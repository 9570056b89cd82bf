// The ops of a layer that a parallel plan runs differently, and the plan that hands them out.
//
// Layers are single-device code: they call these ops (and the others, through the model's
// Backend) on their own (per-rank) shapes and never see ranks. The default ModelPlan here runs one
// device: every op is the kernel call. A tensor-parallel plan (src/parallel/tp_plan.hpp) gives
// each rank's layers its share of the dims and ops that combine the ranks' parts (Megatron's
// column-, row- and vocabulary-parallel layers, and sequence parallelism's norms), so that the
// same layer code runs every layout:
//   NormOp        out (all BT tokens) = norm of this rank's stream tokens of inp
//   LinearOp      out = inp · wᵀ + b and its backward, however the weight is split
//   EmbeddingOp   the stream from the tokens, and the tables' gradients
//   AttentionOp   causal attention of the queries held here (context parallelism: against every
//                 rank's keys and values)
//   LossOp        per-token cross-entropy (and dlogits) over however the vocabulary is split
// A linear whose weight the layer declares split along dim 0 (output features) is column-
// parallel, along dim 1 (input features) row-parallel (layer_list.hpp's ParamDecl::split_dim,
// carried by the rank's ParamTensor).
// Not here: the kernels' contracts (kernels/ops), the layer list (layer_list.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "src/model/expert_exchange.hpp"
#include "src/model/layer_list.hpp"
#include "src/model/param_layout.hpp"

namespace lockstep {

// The norm kernels of a layer's kind (LayerNorm with bias, or RMSNorm: mean and b unused), over
// `rows` rows of d_model; the forward's out rounded to bf16 where round_bf16.
void norm_forward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, float* out, float* mean, float* rstd,
                       const float* inp, const float* w, const float* b, bool round_bf16);
void norm_backward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t token_offset, float* dinp,
                        GradSink dw, GradSink db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd);

// The MLP activation of a layer's kind (GELU, or SwiGLU on [gate | up]) over `rows` rows of F
// hidden features: fc's outputs (ffn_fc_width of them a row) in, the activation out; and back.
void activation_forward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t F, float* out,
                             const float* fc);
void activation_backward_rows(Backend& be, const LayerDesc& layer, Mode mode, int64_t rows, int64_t F, float* dfc,
                              const float* fc, const float* dout);

// The positions of each sequence whose tokens this rank holds: blocks of consecutive positions (all
// of [0, T) in one block, or a context-parallel rank's share). A micro-batch's tokens here are
// ordered block by block: block 0 of every sequence, then block 1, ... — so the tokens of one block
// are a (B, length) run, and every other op sees B·(Σ lengths) tokens in a row.
struct SeqBlock {
  int64_t position = 0, length = 0;
};
int64_t seq_tokens(std::span<const SeqBlock> blocks);  // Σ lengths
// f(i, s, position) for each token of B sequences at the positions `seq`, in that order: i its
// index among them, s its sequence, position its position in the whole sequence.
template <class F>
void for_each_token(std::span<const SeqBlock> seq, int64_t B, F&& f) {
  int64_t i = 0;
  for (const SeqBlock& k : seq) {
    for (int64_t s = 0; s < B; ++s) {
      for (int64_t t = 0; t < k.length; ++t, ++i) f(i, s, k.position + t);
    }
  }
}

// The embedding kernels over B sequences' tokens at the positions `seq` (the tensor-parallel
// plan's vocabulary shard in `s`, whose T is ignored): each block a call of its own, with the
// block's rows of wpe and of its gradient.
void embedding_forward_blocks(Backend& be, Mode mode, EmbeddingShape s, std::span<const SeqBlock> seq, float* out,
                              const int32_t* tokens, const float* wte, const float* wpe);
void embedding_backward_blocks(Backend& be, Mode mode, EmbeddingShape s, std::span<const SeqBlock> seq,
                               int64_t token_offset, GradSink dwte, GradSink dwpe, const float* dout,
                               const int32_t* tokens);

class NormOp {
 public:
  virtual ~NormOp() = default;
  // out (BT, C) = norm of the stream tokens of inp held here, rounded to bf16 where round_bf16 (the
  // input of a bf16 linear: NormShape::round_bf16); mean, rstd: the stream tokens'.
  virtual void forward(Backend& be, Mode mode, int64_t BT, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, bool round_bf16) = 0;
};

class LinearOp {
 public:
  virtual ~LinearOp() = default;
  // s: this rank's shape. out: s.N rows (a row-parallel plan under sequence parallelism: the
  // stream tokens' rows only).
  virtual void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w,
                       const float* b) = 0;
  // dout: s.N rows (row-parallel under sequence parallelism: the stream tokens' rows, gathered
  // here); dinp: s.N rows (column-parallel under sequence parallelism: the stream tokens' rows).
  virtual void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                        const float* dout, const float* inp, const float* w) = 0;
};

class EmbeddingOp {
 public:
  virtual ~EmbeddingOp() = default;
  // out: the stream tokens of B sequences, whose positions here are `seq` (ModelPlan::sequence).
  virtual void forward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, float* out,
                       const int32_t* tokens, const float* wte, const float* wpe) = 0;
  // dout: the stream tokens' gradient.
  virtual void backward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, int64_t token_offset,
                        GradSink dwte, GradSink dwpe, const float* dout, const int32_t* tokens) = 0;
};

// Causal attention (kernels/ops/attention.hpp) of B sequences' queries held here: s has the whole
// T and this rank's heads; qkv, out, dqkv and dout hold the tokens here (ModelPlan::sequence's
// order), att and scratch (B, NH, tokens here, T) per block of positions.
class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  // What the forward keeps for the backward (the layer's attn/att activation) and the backward's
  // workspace, in floats per query token: the probabilities, NH·T, both by default.
  // keeps_probabilities(): whether what is kept is attn/att itself (observed, dumped).
  virtual int64_t kept_floats(const LayerDims& m) const { return m.NH * m.T; }
  virtual int64_t scratch_floats(const LayerDims& m) const { return m.NH * m.T; }
  virtual bool keeps_probabilities() const { return true; }
  virtual void forward(Backend& be, Mode mode, AttentionShape s, float* out, float* att, const float* qkv) = 0;
  virtual void backward(Backend& be, Mode mode, AttentionShape s, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att) = 0;
};

class LossOp {
 public:
  virtual ~LossOp() = default;
  // losses (N) of logits (N, this rank's vocabulary); with backward, dlogits in place over them.
  virtual void forward(Backend& be, Mode mode, int64_t N, float* losses, float* logits, const int32_t* targets, float dloss,
                       bool backward) = 0;
};

// The rows a linear runs on: the residual stream's tokens — under sequence parallelism a
// row-parallel op then keeps this rank's stream rows of its output, and reads those rows of its
// output gradient — or rows that every tensor-parallel rank holds whole (a MoE layer's expert
// rows and shared experts: its router and combine see every token).
enum class LinearRows : uint8_t { kStream, kWhole };

// A MoE layer's routed experts held here, [first, first + count) of its E, and the exchange that
// brings the rows of the others' tokens routed to them (nullptr: every expert is here).
struct ExpertShard {
  int64_t first = 0, count = 0;
  ExpertExchange* exchange = nullptr;
};

// How the layers run on this rank. The base class is one device.
class ModelPlan {
 public:
  virtual ~ModelPlan() = default;
  // The layer's dims here.
  virtual LayerDims local_dims(const LayerDesc& layer) const { return layer.dims; }
  // This rank's parameters in canonical order.
  virtual std::vector<ParamTensor> param_layout(const ModelDesc& desc) const { return build_param_layout(desc); }
  // The positions of each sequence held here (SeqBlock).
  virtual std::vector<SeqBlock> sequence(int64_t T) const { return {{0, T}}; }
  // Tokens of a BT-token micro-batch in the residual stream here, and the first of them.
  virtual int64_t stream_tokens(int64_t BT) const { return BT; }
  virtual int64_t stream_first(int64_t BT) const { return 0; }
  virtual std::unique_ptr<NormOp> norm(const LayerDesc& layer) const;
  // The linear whose weight is `weight` (this rank's tensor: its split_dim says how it is split)
  // on `rows`.
  virtual std::unique_ptr<LinearOp> linear(const LayerDesc& layer, const ParamTensor& weight, LinearRows rows) const;
  // all (BT, C) = the stream rows of every rank (this rank's: `stream`), in token order: the
  // stream itself without sequence parallelism.
  virtual void gather_stream(const float* stream, float* all, int64_t BT, int64_t C) const;
  // whole (B, T, width) in position order = the rows of every rank's positions (this rank's:
  // `local`, in sequence()'s order): what a layer whose decisions span a sequence reads (a MoE
  // layer's router). One device: a copy.
  virtual void gather_positions(const float* local, float* whole, int64_t B, int64_t T, int64_t width) const;
  virtual std::unique_ptr<EmbeddingOp> embedding(const LayerDesc& layer) const;
  virtual std::unique_ptr<AttentionOp> attention(const LayerDesc& layer) const;
  virtual std::unique_ptr<LossOp> loss(const LayerDesc& layer) const;
  // x[i] = the maximum over the ranks that hold parts of one tensor (tensor parallelism): a
  // per-tensor statistic of a split tensor. One device: x as it is.
  virtual void max_over_shards(float* x, int64_t n) const {}
  // The routed experts of MoE layer `layer` held here.
  virtual ExpertShard experts(const LayerDesc& layer) const { return {0, layer.experts, nullptr}; }
};

// The ops of `inner` (which must outlive it): the base of plans that change only some of them —
// expert and context parallelism over a tensor-parallel or one-device plan.
class ForwardingPlan : public ModelPlan {
 public:
  explicit ForwardingPlan(const ModelPlan& inner) : inner_(inner) {}
  LayerDims local_dims(const LayerDesc& layer) const override { return inner_.local_dims(layer); }
  std::vector<ParamTensor> param_layout(const ModelDesc& desc) const override { return inner_.param_layout(desc); }
  std::vector<SeqBlock> sequence(int64_t T) const override { return inner_.sequence(T); }
  int64_t stream_tokens(int64_t BT) const override { return inner_.stream_tokens(BT); }
  int64_t stream_first(int64_t BT) const override { return inner_.stream_first(BT); }
  std::unique_ptr<NormOp> norm(const LayerDesc& layer) const override { return inner_.norm(layer); }
  std::unique_ptr<LinearOp> linear(const LayerDesc& layer, const ParamTensor& weight, LinearRows rows) const override {
    return inner_.linear(layer, weight, rows);
  }
  void gather_stream(const float* stream, float* all, int64_t BT, int64_t C) const override {
    inner_.gather_stream(stream, all, BT, C);
  }
  void gather_positions(const float* local, float* whole, int64_t B, int64_t T, int64_t width) const override {
    inner_.gather_positions(local, whole, B, T, width);
  }
  std::unique_ptr<EmbeddingOp> embedding(const LayerDesc& layer) const override { return inner_.embedding(layer); }
  std::unique_ptr<AttentionOp> attention(const LayerDesc& layer) const override { return inner_.attention(layer); }
  std::unique_ptr<LossOp> loss(const LayerDesc& layer) const override { return inner_.loss(layer); }
  void max_over_shards(float* x, int64_t n) const override { inner_.max_over_shards(x, n); }
  ExpertShard experts(const LayerDesc& layer) const override { return inner_.experts(layer); }

 protected:
  const ModelPlan& inner_;
};

// `inner`, the plan's op of a linear, in bf16 (precision.hpp; bf16_linear.cpp): its output
// gradient read rounded to bf16, its product and input gradient rounded to bf16, and its weight
// read rounded to bf16 while *weight_read_rounded (the caller passes the fp32 master weight then,
// not a bf16 copy; nullptr: never). `weight_read_rounded` must outlive the op.
std::unique_ptr<LinearOp> bf16_linear(std::unique_ptr<LinearOp> inner, const bool* weight_read_rounded = nullptr);

class Fp8State;

// What the model's fp8 linears share: the plan, the scaling state, whether passes record their
// statistics now (not in evaluation nor a recomputed forward), and scratch for the quantized
// copies (grown as needed; one op runs at a time).
struct Fp8Scratch {
  std::vector<float> x, dy, dy_row, dy_col;
};
// The quantized copies of one fp8 linear's weight (its own, so that observers can tell the weight
// by its address: verify/detect/abft.hpp): rowwise for fprop; columnwise for dgrad where the
// recipe's blocks differ by direction (mxfp8), else empty and rowwise serves both.
struct Fp8WeightCopies {
  std::vector<float> rowwise, columnwise;
};
// An fp8 GEMM as it ran, for an observer that checks its quantization (the fp8 sentinel,
// verify/detect/fp8_sentinel.hpp): C (M × N) = Σ over k < K of A(i, k) · B(k, j). Each operand is
// a row-major matrix as it was quantized (its QuantizeShape's rows × cols), read as it is —
// A(i, k) at (i, k), B(k, j) at (k, j) — or transposed.
enum class Fp8Gemm : uint8_t { kFprop, kDgrad, kWgrad };
const char* fp8_gemm_name(Fp8Gemm g);  // "fprop" | "dgrad" | "wgrad"
struct Fp8GemmOperand {
  const float* high = nullptr;       // the bf16 values
  const float* quantized = nullptr;  // the dequantized fp8 values the GEMM read
  QuantizeShape shape;
  bool transposed = false;           // A stored as (k, i), B as (j, k)
};
struct Fp8GemmView {
  const std::string& linear;
  Fp8Gemm gemm;
  int64_t M, N, K;
  Fp8GemmOperand a, b;
};
using Fp8GemmTap = std::function<void(const Fp8GemmView&)>;

struct Fp8LinearSetup {
  const ModelPlan& plan;
  Fp8State& state;
  std::function<bool()> recording;
  Fp8Scratch& scratch;
  const Fp8GemmTap* tap;  // called with every fp8 GEMM of a recording pass while set
};

// `inner`, the plan's op of linear `name`, in fp8 (fp8_recipe.hpp; fp8_linear.cpp). stream_output:
// as bf16_linear's. `weights` must outlive the op.
std::unique_ptr<LinearOp> fp8_linear(std::unique_ptr<LinearOp> inner, const Fp8LinearSetup& setup,
                                     const std::string& name, bool stream_output, Fp8WeightCopies& weights);

}  // namespace lockstep
