// One layer of the model list as it runs: the interface every kind in src/model/layers/ implements,
// the micro-batch a call works on (Pass), and the model-wide state layers share (LayerContext:
// the backend that runs the ops, parameters, gradient sinks, observers, op modes, backward scratch).
//
// Data flow: layer i reads the output of layer i−1 for the same micro-batch; a forward keeps what
// its backward needs in the layer's own activations, one slot per micro-batch in flight, so
// several micro-batches can be between their forward and their backward at once (a pipeline
// schedule). Backward receives the gradient of the layer's output and writes that of its input:
// a residual layer (y = x + f(x)) updates it in place, the others write another buffer. Each layer
// shows its tensors to the observer under its declared hook names, and at the end of its backward
// the gradient of its input under `grad/` + its input's name.
// Not here: which layers (layer_list.hpp), how a parallel plan runs the ops that cross ranks
// (modules.hpp), the list itself and its buffers (model.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"
#include "src/core/tensor_view.hpp"
#include "src/model/layer_list.hpp"
#include "src/model/fp8_state.hpp"
#include "src/model/modules.hpp"
#include "src/model/moe_stats.hpp"
#include "src/model/param_layout.hpp"
#include "src/model/precision.hpp"

namespace lockstep {

class ModelPlan;
class LinearOp;

// Observer of named tensors as the model computes them (verify/, dumps, fault injection): called
// with the stable hook name and a view of the tensor (its dtype, shape and data). Names are the layers' declared hooks: forward
// `embed/out`, `layer/3/ln1/out`, `layer/3/attn/qkv` (after RoPE), `layer/3/attn/att`,
// `layer/3/attn/out`, `layer/3/attn/res`, `layer/3/ln2/out`, `layer/3/mlp/fc`, `layer/3/mlp/act`,
// `layer/3/mlp/res`, `lnf/out`, `logits`, `losses`; backward the same names prefixed `grad/` for
// the gradient of the loss with respect to that tensor (`grad/logits`, `grad/layer/3/mlp/act`,
// ..., `grad/embed/out`). Parameter gradients are observed after finish_grads() through grads()
// and param_layout(). The data is the model's own buffer: observers only read it, except fault
// injection (src/train/inject.hpp), which edits it in place; the model continues from the edited
// tensor.
using TensorHook = std::function<void(std::string_view name, const TensorView& tensor)>;

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

// Where the parameters are when the model does not hold them whole (ModelOptions::sharded_params;
// ZeRO-3 keeps a shard per data-parallel rank: src/parallel/zero3_params.hpp). Before each layer
// runs a forward or a backward the model asks for the tensors that layer reads
// (Model::layer_params) and the layers read them where this says, until the next request; `next`
// is the layer the model will ask for after this one (SIZE_MAX: none known), whose tensors the
// storage may start to gather meanwhile.
class ParamStorage {
 public:
  virtual ~ParamStorage() = default;
  // Where each of Model::layer_params(layer) is, in that order.
  virtual std::span<float* const> gather(size_t layer, size_t next) = 0;
};

// Called in every micro-batch each time a contiguous range [first, end) of the flat gradient
// buffer has received its last contribution of the micro-batch (canonical mode: its exact sums
// are complete); last_micro: the step's last micro-batch, after which the range is final.
using GradReadyHook = std::function<void(int64_t first, int64_t end, bool last_micro)>;

// One micro-batch's pass through the layers.
struct Pass {
  int slot = 0;              // activation slot of this micro-batch
  int64_t B = 0, T = 0;      // sequences, tokens per sequence
  int64_t BT = 0;            // tokens
  // The residual stream's tokens here (all BT, or a plan's share of them: sequence parallelism),
  // as (RB, RT) for hooks, and the global index of the first of them.
  int64_t RS = 0, RB = 0, RT = 0;
  int64_t stream_offset = 0;
  int64_t token_offset = 0;  // global index of the micro-batch's first token in the step's batch
  const int32_t* inputs = nullptr;   // (B, T)
  const int32_t* targets = nullptr;  // (B, T)
  bool eval = false;         // forward only: the loss layer computes the losses in its forward
  bool last_micro = false;   // the step's last micro-batch (grad-ready hook)
  float dloss = 0;           // gradient scale of each token's loss
  ChunkCombiner* loss_sum = nullptr;  // per-token losses added chunk by chunk
};

// Activation recomputation: which layers keep only their output between forward and backward and
// run their forward again just before their backward — none, the attention sub-layers (selective:
// their (B, NH, T, T) probabilities are most of the activations at long sequences), or every
// attention, MLP and MoE sub-layer (full). The recomputed forward makes the same bits.
enum class Recompute : uint8_t { kNone, kSelective, kFull };
inline constexpr Recompute kRecomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
const char* recompute_name(Recompute r);
// "none" | "selective" | "full"; ConfigError naming `where` otherwise.
Recompute parse_recompute(const std::string& text, const std::string& where);

// The model-wide state the layers of one model share.
class LayerContext {
 public:
  LayerContext(Mode mode, const ModelPlan& plan, Backend& backend, PrecisionRecipe precision)
      : mode_(mode), plan_(plan), backend_(backend), precision_(std::move(precision)) {}

  Mode mode() const { return mode_; }
  const ModelPlan& plan() const { return plan_; }
  Backend& backend() const { return backend_; }

  // The mode the op whose forward output is hook `site` runs in: mode() unless set_op_mode.
  Mode mode_of(const std::string& site) const {
    if (op_modes_.empty()) return mode_;
    for (const auto& [op, mode] : op_modes_)
      if (op == site) return mode;
    return mode_;
  }
  void set_op_mode(std::string op, Mode mode) { op_modes_.emplace_back(std::move(op), mode); }
  void clear_op_modes() { op_modes_.clear(); }

  // Whether linear `linear` runs in bf16 or fp8: its operands are stored in bf16 (precision.hpp
  // names the linears).
  bool low_precision(const std::string& linear) const { return precision_.low_precision(linear); }
  // The op of linear `name` (weight: this rank's tensor): the plan's, in the recipe's precision.
  std::unique_ptr<LinearOp> linear(const LayerDesc& layer, const ParamTensor& weight, const std::string& name,
                                   LinearRows rows = LinearRows::kStream);
  // The weight linear `name` computes with: the bf16 copy of the master weight, or the parameter
  // itself (fp32; bf16 already: PrecisionRecipe::bf16_params; or the fp32 master that a bf16
  // linear reads rounded while weights_read_rounded_).
  // Gathered parameters (a ParamStorage) are rounded to bf16 in place where their layer's linear
  // runs in bf16: param(t) then gives the copy.
  float* linear_weight(const ParamTensor* t, const std::string& name) {
    const bool copy = low_precision(name) && !precision_.bf16_params() && param_storage_ == nullptr &&
                      reads_copy(precision_.fp8_linear(name), weights_read_rounded_);
    return copy ? weight_copies_.data() + t->offset : param(t);
  }
  // An activation of n floats that linear `name` reads (or wrote: q, k, v after RoPE): stored in
  // bf16 (rounded in place) where that linear runs in bf16 or fp8.
  void store_for(const std::string& name, float* data, int64_t n) {
    if (low_precision(name)) backend_.round_to_bf16(n, data, data);
  }
  int64_t weight_grad_chunk(const std::string& linear) const { return precision_.weight_grad_chunk(linear); }
  // The fp8 recipe's state (fp8_state.hpp); nullptr unless the model has fp8 linears.
  Fp8State* fp8() const { return fp8_.get(); }

  // The parameter named `name` in this rank's layout (or the tied copy of wte), nullptr if the
  // model has none. A layer's constructor finds every tensor it reads this way.
  const ParamTensor* find_param(const std::string& name);
  const ParamTensor* find_param(const std::string& name) const;
  float* param(const ParamTensor* t) {
    if (t == nullptr) return nullptr;
    if (param_storage_ == nullptr) return params_.data() + t->offset;
    return gathered_[static_cast<size_t>(t - layout_.data())];
  }
  // Where t's gradient goes (empty for nullptr).
  GradSink sink(const ParamTensor* t);
  // Reports [first->offset, last's end) to the grad-ready hook (last: nullptr for first alone).
  void grads_ready(const Pass& p, const ParamTensor* first, const ParamTensor* last = nullptr) const {
    if (last == nullptr) last = first;
    if (grad_ready_) grad_ready_(first->offset, last->offset + last->numel, p.last_micro);
  }

  // The embedding's backward in the step's last micro-batch, before it reports wte ready: adds
  // what Model::add_to_tied_grad was given (another stage's head gradient of wte), once.
  void add_tied_partial(const ParamTensor* wte) {
    if (!tied_partial_) return;
    tied_partial_(sink(wte));
    tied_partial_ = nullptr;
  }

  // Whether this pass counts for the step's statistics: a training pass, not an evaluation nor a
  // recomputed forward.
  bool recording() const { return !recomputing_ && !evaluating_; }
  // A MoE layer's statistics (moe_stats.hpp): registered as it is built, by index.
  size_t add_moe_stats(const std::string& layer, int64_t experts) {
    moe_stats_.push_back({.layer = layer, .routed = std::vector<double>(static_cast<size_t>(experts)),
                          .kept = std::vector<double>(static_cast<size_t>(experts))});
    return moe_stats_.size() - 1;
  }
  MoeLayerStats& moe_stats(size_t index) { return moe_stats_[index]; }
  // The selection bias of MoE layer `layer` ("layer/3/moe"; Model::moe_selection_biases), nullptr
  // where its layer has none.
  const float* moe_selection_bias(const std::string& layer) const {
    const auto it = moe_bias_.find(layer);
    return it == moe_bias_.end() ? nullptr : it->second.data();
  }

  // A split backward (ModelOptions::split_backward): layers leave their linears' weight gradients
  // to Layer::backward_weight.
  bool defers_weight_grads() const { return defer_weight_grads_; }

  // Observers see each tensor once: not again when a recomputed forward makes it a second time.
  bool observing() const { return static_cast<bool>(hook_) && !recomputing_; }
  void observe(const std::string& name, float* data, std::initializer_list<int64_t> shape) const {
    if (hook_ && !recomputing_) hook_(name, TensorView::contiguous(data, DType::kF32, Shape(shape)));
  }

  // Activation recomputation (ModelOptions::recompute): whether layers of `kind` run their forward
  // again just before their backward, and the activations such layers share — one set for all of
  // them, every slot, made by `make` at the first request for `key` — since only one of them is
  // between its recomputed forward and its backward at a time.
  bool recomputed(LayerKind kind) const;
  template <class T>
  T& shared_activations(const std::string& key, const std::function<T()>& make) {
    auto& entry = shared_activations_[key];
    if (!entry) entry = std::make_shared<T>(make());
    return *std::static_pointer_cast<T>(entry);
  }

  // Backward scratch shared by every layer (sized for the largest need): a layer's backward may
  // use it freely, from the start, for as many floats as it declared.
  float* scratch() { return scratch_.data(); }
  // At least n floats every layer shares for what one of its forward or backward calls needs and
  // nothing after it, grown to the largest request (a MoE layer's rows exchanged under expert
  // parallelism, whose number varies from call to call). Earlier pointers die at each request.
  float* transient(int64_t n) {
    if (transient_.size() < static_cast<size_t>(n)) transient_.resize(static_cast<size_t>(n));
    return transient_.data();
  }

 private:
  friend class Model;
  // Allocates the own gradient buffers, zeroed, unless they exist or a GradStorage is set.
  void own_grads();
  // Whether a bf16 linear (an fp8 one: fp8_linear) reads its weight's copy rather than the master
  // weight, where the backend's bf16 products do (read_rounded) or do not round as they pack.
  static bool reads_copy(bool fp8_linear, bool read_rounded) { return fp8_linear || !read_rounded; }
  // The bf16 copies of the weights of bf16 and fp8 linears, from the master weights; of the fp8
  // linears' only where the backend's bf16 products read the master weights rounded as they pack
  // them (weights_read_rounded_, decided here once a step).
  void refresh_weight_copies();
  // With a ParamStorage: layer `layer`'s tensors gathered (their bf16 linears' weights rounded)
  // before it runs; `next` as ParamStorage::gather's.
  void gather_layer(size_t layer, size_t next);

  Mode mode_;
  const ModelPlan& plan_;
  Backend& backend_;
  std::vector<ParamTensor> layout_;
  std::vector<float> params_, grads_;
  // Canonical mode only; a pointer so that Model::set_grad_storage can free it (it does not move).
  std::unique_ptr<ExactAccumulator> exact_grads_ = std::make_unique<ExactAccumulator>();
  GradStorage* storage_ = nullptr;  // instead of grads_ and exact_grads_
  // Instead of params_ (Model::set_param_storage): where each tensor of layout_ was gathered last,
  // and the tensors each layer reads (recorded from its find_param calls as it is built).
  ParamStorage* param_storage_ = nullptr;
  std::vector<float*> gathered_;
  std::vector<std::vector<const ParamTensor*>> layer_params_;
  // Per layer, the weights its own bf16 linears read (a tied wte is the head's, not the embedding's).
  std::vector<std::vector<const ParamTensor*>> layer_copies_;
  size_t building_ = SIZE_MAX;  // the layer being built
  std::vector<std::pair<std::string, Mode>> op_modes_;
  PrecisionRecipe precision_;
  std::vector<const ParamTensor*> copied_weights_;  // the weights of bf16 linears
  std::vector<float> weight_copies_;                // at the params' offsets (bf16 linears' weights only), or none
  bool weights_read_rounded_ = false;               // bf16 (not fp8) linears read the master weights
  std::unique_ptr<Fp8State> fp8_;
  Fp8Scratch fp8_scratch_;
  std::map<const ParamTensor*, Fp8WeightCopies> fp8_weights_;  // allocated once: their addresses are fixed
  Fp8GemmTap fp8_tap_;
  TensorHook hook_;
  GradReadyHook grad_ready_;
  std::vector<float> scratch_;
  std::vector<float> transient_;
  Recompute recompute_ = Recompute::kNone;
  bool defer_weight_grads_ = false;
  bool recomputing_ = false;  // a recomputed forward is running
  bool evaluating_ = false;   // an evaluation's forward is running
  std::map<std::string, std::shared_ptr<void>> shared_activations_;
  std::vector<MoeLayerStats> moe_stats_;
  std::map<std::string, std::vector<float>> moe_bias_;  // every MoE layer of the list with one
  // A pipeline stage with a tied head but not the embedding holds a copy of wte: at the end of
  // params_, outside layout_ (so nothing updates, reduces or saves it), its gradient in tied_grad_
  // (fast) or tied_exact_ (canonical), never in a GradStorage (src/train/pipeline.hpp sends it to
  // the embedding's stage and the updated values back).
  std::optional<ParamTensor> tied_copy_;
  std::vector<float> tied_grad_;
  ExactAccumulator tied_exact_;
  // The embedding's stage: the other stage's part of wte's gradient, to add in the step's last
  // micro-batch (empty: none).
  std::function<void(const GradSink&)> tied_partial_;
};

// The activations (of type Acts) a layer keeps from its forward for its backward: one set per
// slot, or — for a layer of a recomputed kind — the one set every such layer shares under `key`
// (LayerContext::shared_activations). `grow` sizes a set: it must only enlarge its buffers, since a
// shared set serves every layer that asks.
template <class Acts>
class SlotActivations {
 public:
  SlotActivations(LayerContext& ctx, LayerKind kind, const std::string& key, int slots,
                  const std::function<void(Acts&)>& grow) {
    if (ctx.recomputed(kind)) {
      shared_ = &ctx.shared_activations<Acts>(key, [] { return Acts{}; });
      grow(*shared_);
      return;
    }
    own_.resize(static_cast<size_t>(slots));
    for (Acts& a : own_) grow(a);
  }
  Acts& operator[](int slot) { return shared_ != nullptr ? *shared_ : own_[static_cast<size_t>(slot)]; }

 private:
  Acts* shared_ = nullptr;
  std::vector<Acts> own_;
};

// v.resize(n) where that enlarges it.
inline void grow_to(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

class Layer {
 public:
  explicit Layer(const LayerDesc& desc) : desc_(desc) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerDesc& desc() const { return desc_; }

  // Forward of pass p; `in` is the previous layer's output of the same micro-batch (stream layout:
  // p.RS tokens of d_model), nullptr for a layer that reads tokens.
  virtual void forward(LayerContext& ctx, const Pass& p, const float* in) = 0;
  // This layer's output of slot `slot` (what the next layer reads): stream layout, except a loss
  // layer's (its logits).
  virtual const float* output(int slot) const = 0;
  // Backward of pass p (its forward ran with the same slot): `dout` the gradient of the output
  // (nullptr for the loss layer, whose gradient starts at its loss), `dinp` where the gradient of
  // the input goes (== dout for a residual layer; nullptr for a layer that reads tokens); `in` as
  // in forward.
  virtual void backward(LayerContext& ctx, const Pass& p, const float* in, float* dout, float* dinp) = 0;
  // Where the context defers weight gradients (LayerContext::defers_weight_grads), backward leaves
  // those of the layer's linears — the GEMMs a zero-bubble schedule moves into the pipeline's idle
  // time — to this pass, run later for the same slot with the same `in`, and computes the rest. A
  // layer whose parameter gradients all come in its backward keeps this empty one.
  virtual void backward_weight(LayerContext& ctx, const Pass& p, const float* in) {}
  // y = x + f(x): backward updates the stream gradient in place.
  virtual bool residual() const { return false; }
  // Floats of LayerContext::scratch its backward uses for a micro-batch of max_tokens tokens.
  virtual int64_t scratch_floats() const { return 0; }

 protected:
  // Full hook names (prefix included), built once.
  std::string name(std::string_view local) const { return desc_.prefix + std::string(local); }

 private:
  LayerDesc desc_;
};

// What a layer kind's constructor gets: its dims on this rank, the plan's ops and the sizes to
// allocate for.
struct LayerBuild {
  LayerContext& ctx;
  LayerDims local;      // this rank's dims (the plan's share of heads, features, vocabulary)
  int64_t max_batch;    // sequences of the largest micro-batch
  int64_t max_tokens;   // its tokens here (max_batch times the positions held: ModelPlan::sequence)
  int64_t max_stream;   // stream tokens of the largest micro-batch
  int slots;            // micro-batches in flight at once
};

}  // namespace lockstep
