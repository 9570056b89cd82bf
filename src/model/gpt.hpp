// The GPT model on one device: parameters, activations, forward and backward over the kernels.
//
// Layout follows llm.c: every parameter lives in one flat fp32 buffer (in the canonical order of
// `param_layout()`, which is also the checkpoint and model-hash order), gradients in a second one;
// activations are owned per micro-batch size and reused. The forward/backward is written out layer
// by layer, each op a kernels/ops call, so every tensor has a stable hook name
// (`layer/3/attn/qkv` ...). No ranks here: parallel layouts are applied from outside.
//
// Gradients: fast mode accumulates into the fp32 gradient buffer; canonical mode accumulates every
// chunk partial exactly (ExactAccumulator) across micro-batches and rounds once in finish_grads(),
// so the gradient does not depend on how the batch was split.
//
// Tensor parallelism: given a TpGroup, the object holds one rank's shards (param_layout.hpp) and
// runs Megatron's split: column-parallel QKV and MLP-in and row-parallel attention-out and
// MLP-out (heads split across ranks), vocabulary-parallel embedding and cross-entropy with the
// head (no rank forms full-vocabulary logits). Where a reduction is split across ranks — the
// row-parallel outputs, the activation gradients of column-parallel layers and of the head, the
// softmax denominator — each rank computes the unsplit op's canonical chunk partials for its slice
// and the group combines them exactly (TpGroup::all_reduce_exact), so canonical mode gives the
// bits of one device. Replicated tensors (norms, row-parallel biases, wpe) get identical full
// gradients on every rank. Hooks see this rank's shards (where each lies in the one-device tensor:
// src/model/hook_layout.hpp; change both together — tests/unit/parallel/test_hook_layout.cpp checks
// them against each other). These pieces live in gpt_parallel.cpp.
//
// Sequence parallelism (with tp): the residual stream and the norms — everything between a
// row-parallel output and the next column-parallel input — hold a contiguous 1/tp of the
// micro-batch's tokens (block r of the flattened (B, T) token index, so that the collectives move
// contiguous blocks); the norm outputs are all-gathered before QKV, MLP-in and the head, and the
// row-parallel outputs (and the embedding) reduce-scattered instead of all-reduced; backward uses
// the conjugates (reduce-scatter of the column-parallel input gradients, all-gather of the
// residual gradient before the row-parallel layers and the embedding). Norm weight and bias
// gradients then cover this rank's tokens only: the caller sums them over the group before the
// gradient reduction (src/parallel/tensor_parallel.hpp). Chunks of 64 tokens stay whole on one
// rank (micro-batch tokens / tp a multiple of 64 in canonical mode), so the bits do not change.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"
#include "src/model/config.hpp"
#include "src/model/param_layout.hpp"
#include "src/model/tp_group.hpp"

namespace lockstep {

// Observer of named tensors as the model computes them (verify/, dumps): called with the stable
// hook name, the data and the shape. Names: forward `embed/out`, `layer/3/ln1/out`,
// `layer/3/attn/qkv` (after RoPE), `layer/3/attn/att`, `layer/3/attn/out`, `layer/3/attn/res`,
// `layer/3/ln2/out`, `layer/3/mlp/fc`, `layer/3/mlp/act`, `layer/3/mlp/res`, `lnf/out`,
// `logits`, `losses`; backward the same names prefixed `grad/` for the gradient of the loss with
// respect to that tensor (`grad/logits`, `grad/layer/3/mlp/act`, ..., `grad/embed/out`).
// Parameter gradients are observed after finish_grads() through grads() and param_layout().
// The data is the model's own buffer: observers only read it; fault injection (verify/inject)
// edits it in place, and the model continues from the edited tensor.
using TensorHook = std::function<void(std::string_view name, float* data,
                                      std::span<const int64_t> shape)>;

// Where the backward adds parameter gradients when not into the model's own full buffers (ZeRO-2
// stages a few buckets at a time: src/parallel/zero2_grads.hpp). sink(t) is asked before every op
// that adds to t's gradient, possibly more than once per micro-batch (a tied wte: the head, then
// the embedding); it must give the same storage for t until the grad-ready hook has reported all
// of t in that micro-batch, and storage it hands out first in a micro-batch holds zeros.
class GradStorage {
 public:
  virtual ~GradStorage() = default;
  virtual GradSink sink(const ParamTensor& t) = 0;
  // The model's zero_grad(): a step begins.
  virtual void zero() = 0;
};

class Gpt {
 public:
  // micro_batch: the largest number of sequences passed to one forward_backward call.
  // tp: the tensor-parallel group this rank's shards belong to (nullptr: the whole model here);
  // it must outlive the model. sequence_parallel: split the residual stream's tokens over tp.
  Gpt(const ModelConfig& cfg, Mode mode, int64_t micro_batch, TpGroup* tp = nullptr,
      bool sequence_parallel = false);
  bool sequence_parallel() const { return sp_; }

  const ModelConfig& config() const { return cfg_; }
  Mode mode() const { return mode_; }
  const std::vector<ParamTensor>& param_layout() const { return layout_; }
  const ParamTensor& param(const std::string& name) const;
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  // The model's own gradient buffers (zero until a backward adds to them), allocated at their
  // first use — so that a model whose gradients go to a GradStorage from the start never holds
  // them, not even at its peak — and released (grads() is nullptr) while a GradStorage is set.
  float* grads();
  const float* grads() const { return grads_.data(); }
  // Canonical mode: the exact per-element gradient sums before finish_grads() rounds them (data
  // parallelism combines these across ranks exactly).
  ExactAccumulator& exact_grads();
  // Bytes of the model's own gradient buffers (fp32, and in canonical mode the exact sums' doubles
  // and spill flags; 0 while a GradStorage is set).
  uint64_t grad_bytes() const;
  // Sends every parameter gradient to `storage` (it must outlive its use) and releases the
  // model's own buffers; nullptr takes them back (allocated, zeroed, at their next use).
  // finish_grads() needs the own buffers.
  void set_grad_storage(GradStorage* storage);

  // Installs (or, with an empty function, removes) the tensor observer. Without one, observing
  // costs one branch per tensor.
  void set_hook(TensorHook hook) { hook_ = std::move(hook); }
  // Runs one op's forward in `mode` instead of the model's mode: a different but valid
  // accumulation order for that op's forward (divergence injection and bisect tests; the backward
  // keeps the model's mode, whose gradient sinks it needs). The op is named by its forward output's
  // hook name, e.g. `layer/1/attn/att` or `logits`.
  void set_op_mode(std::string op, Mode mode) { op_modes_.emplace_back(std::move(op), mode); }
  void clear_op_modes() { op_modes_.clear(); }
  // Whether `site` names an op set_op_mode can switch (`layer/N/attn/att`, `logits`, ...): the
  // forward output of a norm, linear, attention, activation or embedding.
  static bool is_op_site(std::string_view site);

  // Deterministic initialisation from cfg.seed: each element is a function of (seed, tensor name,
  // element index in the global tensor) only (GPT-2 scheme: N(0, init_std), residual projections scaled by
  // 1/sqrt(2·n_layers), biases 0, norm weights 1).
  void init_parameters();

  // Model FLOPs per trained token: 6·N (N = parameters in matmuls, the tied head counted once as
  // a matmul) + 12·L·C·T (attention scores and values), the PaLM/Megatron convention.
  double flops_per_token() const;

  void zero_grad();
  // One micro-batch of B sequences: forward, loss, backward; parameter gradients accumulate.
  // token_offset: global index of this micro-batch's first token in the step's global batch;
  // dloss: gradient scale of each token's loss (1 / tokens in the global batch).
  // The micro-batch's per-token losses are added, chunk by chunk, to loss_sum.
  void forward_backward(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                        int64_t B, int64_t token_offset, float dloss, ChunkCombiner& loss_sum);
  // Runs forward_backward over a batch of B sequences in micro-batches of MB (B % MB == 0);
  // first_token is the global index of the batch's first token.
  void forward_backward_batch(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                              int64_t B, int64_t MB, int64_t first_token, float dloss,
                              ChunkCombiner& loss_sum);
  // Canonical mode: rounds the exact gradient sums into grads(). Fast mode: nothing to do.
  void finish_grads() { finish_grads(0, num_params()); }
  // The same for the elements [first, end) of the flat buffer only.
  void finish_grads(int64_t first, int64_t end);

  // Called in every micro-batch each time a contiguous range [first, end) of the flat gradient
  // buffer has received its last contribution of the micro-batch (canonical mode: its exact sums
  // are complete), so that data parallelism can start reducing it while the backward pass goes
  // on; last_micro: the step's last micro-batch of forward_backward_batch, after which the range
  // is final for the step. Ranges come op by op in backward order: the untied head, lnf, then per
  // layer from the last to the first mlp/proj, mlp/fc, ln2, attn/proj, attn/qkv, ln1, then wte
  // and wpe (a tied wte only after the embedding's backward, its second write). Every element is
  // reported once per micro-batch. Under sequence parallelism the norm tensors are reported
  // although they still need the caller's sum over tp (sum_norm_grads). An empty function
  // removes the hook.
  using GradReadyHook = std::function<void(int64_t first, int64_t end, bool last_micro)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  // Forward only; adds the per-token losses to loss_sum.
  void eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, ChunkCombiner& loss_sum);

 private:
  struct LayerActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_attn;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fch, fch_act, res_mlp;
  };
  // This rank's share of the dims split by tensor parallelism (all of them on one device).
  struct LocalDims {
    int64_t NH, NKV;  // heads
    int64_t qkv;      // (NH + 2·NKV)·HS: QKV output features
    int64_t attn;     // NH·HS: attention output features (attn/proj input)
    int64_t F;        // MLP hidden features
    int64_t V, v0;    // vocabulary rows held, the first of them
  };
  struct LayerParams {
    const ParamTensor *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    const ParamTensor *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
  };

  void observe(const char* prefix, int64_t layer, const char* name, float* data,
               std::initializer_list<int64_t> shape) const;
  // The mode op `name` of `layer` (-1: outside the layers) runs in: mode_ unless set_op_mode.
  Mode mode_of(int64_t layer, const char* name) const;
  void build_layout();
  // Allocates the own gradient buffers, zeroed, unless they exist or a GradStorage is set.
  void own_grads();
  void allocate_activations();
  void forward(const int32_t* inputs, int64_t B);
  float* p(const ParamTensor* t) { return t ? params_.data() + t->offset : nullptr; }
  GradSink sink(const ParamTensor* t);
  void norm_forward(Mode mode, int64_t rows, float* out, float* mean, float* rstd,
                    const float* inp, const ParamTensor* w, const ParamTensor* b);
  void norm_backward(int64_t rows, int64_t token_offset, float* dinp, const float* dout,
                     const float* inp, const float* mean, const float* rstd,
                     const ParamTensor* w, const ParamTensor* b);
  // out = inp · wᵀ + b for a row-parallel linear (inp: this rank's input features; out and b whole).
  void linear_forward_row(Mode mode, cpu::LinearShape s, float* out, const float* inp,
                          const ParamTensor* w, const ParamTensor* b);
  // linear_backward for a column-parallel linear (dout: this rank's output features; dinp whole).
  void linear_backward_column(cpu::LinearShape s, int64_t token_offset, float* dinp, GradSink dw,
                              GradSink db, const float* dout, const float* inp, const ParamTensor* w);
  // The embedding's shape for B sequences (this rank's vocabulary rows on TP).
  cpu::EmbeddingShape embedding_shape(int64_t B) const;
  // Tokens of a BT-token micro-batch in the residual stream here (BT / tp under sequence
  // parallelism), and the first of them.
  int64_t residual_tokens(int64_t BT) const { return sp_ ? BT / tp_->size() : BT; }
  int64_t residual_first(int64_t BT) const { return sp_ ? tp_->rank() * residual_tokens(BT) : 0; }
  // Norm of this rank's residual tokens into `out` (all BT tokens: all-gathered under sequence
  // parallelism).
  void norm_forward_gathered(Mode mode, int64_t BT, float* out, float* mean, float* rstd, const float* inp,
                             const ParamTensor* w, const ParamTensor* b);
  // The residual gradient of all BT tokens (all-gathered under sequence parallelism).
  const float* gathered_dres(int64_t BT);
  // Reports [first->offset, last's end) to the grad-ready hook (last: first, or a missing bias).
  void grads_ready(const ParamTensor* first, const ParamTensor* last = nullptr);
  // Per-token losses of logits_ (and, with backward, dlogits in place), vocabulary-parallel on TP.
  void crossentropy(int64_t BT, const int32_t* targets, float dloss, bool backward);

  ModelConfig cfg_;
  Mode mode_;
  int64_t max_batch_;
  TpGroup* tp_;
  bool sp_;
  LocalDims local_;
  std::vector<ParamTensor> layout_;
  std::vector<float> params_, grads_;
  // Canonical mode only; a pointer so that set_grad_storage can free it (it does not move).
  std::unique_ptr<ExactAccumulator> exact_grads_ = std::make_unique<ExactAccumulator>();
  GradStorage* storage_ = nullptr;  // instead of grads_ and exact_grads_

  const ParamTensor *wte_ = nullptr, *wpe_ = nullptr, *lnf_w_ = nullptr, *lnf_b_ = nullptr,
                    *head_ = nullptr;
  std::vector<LayerParams> layers_;

  // Activations (max_batch_ sequences).
  std::vector<float> encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  std::vector<LayerActs> acts_;
  std::vector<float> rope_cos_, rope_sin_;
  // Backward scratch.
  std::vector<float> dres_, dbuf_c_, dqkv_, datty_, datt_, dfch_, dfch_act_;
  // Tensor-parallel scratch: exact partial sums, their rounded combination, cross-entropy row stats.
  ExactAccumulator tp_sum_;
  std::vector<float> tp_buf_, ce_max_, ce_z_, ce_target_;
  // Sequence-parallel scratch: a norm's local output, the gathered residual gradient.
  std::vector<float> sp_norm_, dres_full_;
  TensorHook hook_;
  std::vector<std::pair<std::string, Mode>> op_modes_;
  GradReadyHook grad_ready_;
  bool last_micro_ = false;  // forward_backward runs the step's last micro-batch
};

}  // namespace lockstep
