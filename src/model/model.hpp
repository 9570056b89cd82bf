// The model on one device (or one rank's part of it): the layer list built from its description,
// the parameters and gradients, and the passes of micro-batches through the layers.
//
// Layout follows llm.c: every parameter lives in one flat fp32 buffer, in the canonical order of
// the layer list's declarations (param_layout.hpp: also the checkpoint and model-hash order);
// gradients in a second one. Each layer owns its activations, one slot per micro-batch in flight,
// allocated once and reused; backward scratch is one buffer the layers share.
//
// Passes: forward(mb) runs micro-batch mb through the layers, keeping what backward(mb) needs; up
// to `slots` micro-batches may be between their forward and their backward at once, in any order
// (a 1F1B pipeline schedule runs forwards ahead of backwards). A model may hold contiguous ranges
// of the layers only — chunks: one pipeline stage, or with an interleaved schedule several stages
// of one rank — each run on its own (forward(mb, batch, chunk)); a chunk after the embedding reads
// its input from stage_input(mb, chunk), and a chunk before the loss starts its backward from the
// gradient the caller writes into stage_output_grad(). The parameters of the chunks are one flat
// buffer, in list order.
//
// Recomputation (ModelOptions::recompute): the recomputed layers' forward runs again just before
// their backward, their activations shared (layer.hpp, SlotActivations).
//
// A split backward (ModelOptions::split_backward): backward(mb) computes the gradient of the
// chunk's input and leaves the linears' weight gradients to backward_weight(mb), which the caller
// runs later (ZB-H1 fills the pipeline's idle time with them). In canonical mode the bits do not
// change: the weight gradients are the same products, added exactly.
//
// Gradients: fast mode accumulates into the fp32 gradient buffer; canonical mode accumulates every
// chunk partial exactly (ExactAccumulator) across micro-batches and rounds once in finish_grads(),
// so the gradient does not depend on how the batch was split, nor on the order of micro-batches.
//
// Parallel layouts come from outside: the ModelPlan (modules.hpp) gives this rank's dims,
// parameters and the ops that combine ranks (src/parallel/tp_plan.hpp); this file never sees a
// rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/model/layer.hpp"
#include "src/model/layer_list.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

// One micro-batch of a step.
struct MicroBatch {
  const int32_t* inputs = nullptr;   // (B, T): the embedding's tokens (a stage without it: unused)
  const int32_t* targets = nullptr;  // (B, T): the loss's targets (a stage without it: unused)
  int64_t B = 0;                     // sequences
  int64_t token_offset = 0;          // global index of its first token in the step's batch
};

// Layers [first, end) of the list that a model holds (a pipeline stage, or one of a rank's
// interleaved stages), and the micro-batches whose activations may be alive in them at once.
struct LayerChunk {
  size_t first = 0, end = SIZE_MAX;
  int slots = 1;
};

struct ModelOptions {
  const ModelPlan* plan = nullptr;  // nullptr: one device; it must outlive the model
  Backend* backend = nullptr;       // runs the ops (nullptr: process_backend()); it must outlive the model
  PrecisionRecipe precision = {};   // fp32 unless set (precision.hpp)
  std::vector<LayerChunk> chunks = {LayerChunk{}};  // in list order, disjoint (default: every layer)
  Recompute recompute = Recompute::kNone;  // layers whose forward runs again before their backward
  // The backward runs in two passes (a zero-bubble pipeline schedule): backward(mb) everything but
  // the weight gradients of the linears, backward_weight(mb) those (layer.hpp,
  // Layer::backward_weight); a micro-batch holds its slot until the second. Not with recompute.
  bool split_backward = false;
  // The parameters are not held whole (ZeRO-3): params() is nullptr until hold_params, and a
  // ParamStorage (set_param_storage) gives each layer's before it runs. Not for a pipeline stage
  // with a tied copy of wte, nor with fp8 linears.
  bool sharded_params = false;
};

class Model {
 public:
  // micro_batch: the largest number of sequences of one micro-batch.
  Model(ModelDesc desc, Mode mode, int64_t micro_batch, ModelOptions options = {});
  // The list of a [model] section (describe_model).
  Model(const ModelConfig& cfg, Mode mode, int64_t micro_batch, ModelOptions options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelDesc& desc() const { return desc_; }
  const ModelConfig& config() const { return desc_.config; }
  Mode mode() const { return ctx_.mode(); }
  Backend& backend() const { return ctx_.backend(); }
  const std::vector<ParamTensor>& param_layout() const { return ctx_.layout_; }
  const ParamTensor& param(const std::string& name) const;
  int64_t num_params() const { return num_params_; }
  // The whole flat buffer; nullptr while the parameters are not held whole (sharded_params).
  float* params() { return ctx_.params_.empty() ? nullptr : ctx_.params_.data(); }
  const float* params() const { return ctx_.params_.empty() ? nullptr : ctx_.params_.data(); }
  // sharded_params: allocates the whole buffer (zeros; the caller fills it) or frees it. Passes
  // read the ParamStorage either way.
  void hold_params(bool hold);
  // Where the passes read the parameters from (sharded_params; it must outlive its use).
  void set_param_storage(ParamStorage* storage);
  // The tensors layer `layer` (0: this model's first) reads, in the order of its lookups: its own,
  // and a tied head's wte.
  size_t num_layers() const { return layers_.size(); }
  const std::vector<const ParamTensor*>& layer_params(size_t layer) const { return ctx_.layer_params_[layer]; }
  // Of those, the weights the layer's bf16 linears read as their bf16 rounding (with fp32 master
  // weights; a tied wte is the head's, not the embedding's).
  const std::vector<const ParamTensor*>& layer_bf16_weights(size_t layer) const { return ctx_.layer_copies_[layer]; }
  // bf16 parameters (PrecisionRecipe::bf16_params): every parameter is a bf16 value.
  bool bf16_params() const { return ctx_.precision_.bf16_params(); }
  // The bf16 copy of weight t that bf16 linears compute with (precision.hpp), made from params()
  // at each step's first forward; nullptr where no bf16 linear uses t, the parameters are bf16
  // themselves, or the linears read params() rounded as their products pack them (no copies).
  const float* weight_copy(const ParamTensor& t) const;
  // The quantized copies of weight t that an fp8 linear's GEMMs read (src/model/fp8_linear.cpp):
  // none unless t is an fp8 linear's weight.
  std::vector<const float*> fp8_weight_copies(const ParamTensor& t) const;
  // Installs (or, with an empty function, removes) the observer of fp8 GEMMs (modules.hpp): it sees
  // every fp8 GEMM of the training passes (not evaluation, not recomputed forwards) with its
  // operands. Without one, fp8 linears pay one branch per GEMM.
  void set_fp8_tap(Fp8GemmTap tap) { ctx_.fp8_tap_ = std::move(tap); }
  // The fp8 recipe's state (src/model/fp8_state.hpp): nullptr unless the model has fp8 linears.
  // The MoE layers' statistics of the step so far (this rank's layers, its tokens).
  const std::vector<MoeLayerStats>& moe_stats() const { return ctx_.moe_stats_; }
  // The selection biases (E each) of the list's MoE layers that have one ("layer/3/moe" -> bias),
  // every such layer whichever stage this is; the trainer moves them after each step, and keeps
  // them in checkpoints.
  std::map<std::string, std::vector<float>>& moe_selection_biases() { return ctx_.moe_bias_; }
  Fp8State* fp8() { return ctx_.fp8(); }
  const Fp8State* fp8() const { return ctx_.fp8(); }
  // The model's own gradient buffers (zero until a backward adds to them), allocated at their
  // first use — so that a model whose gradients go to a GradStorage from the start never holds
  // them, not even at its peak — and released (grads() is nullptr) while a GradStorage is set.
  float* grads();
  const float* grads() const { return ctx_.grads_.data(); }
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
  void set_hook(TensorHook hook) { ctx_.hook_ = std::move(hook); }
  // Runs one op's forward in `mode` instead of the model's mode: a different but valid
  // accumulation order for that op's forward (divergence injection and bisect tests; the backward
  // keeps the model's mode, whose gradient sinks it needs). The op is named by its forward output's
  // hook name, e.g. `layer/1/attn/att` or `logits` (is_op_site).
  void set_op_mode(std::string op, Mode mode) { ctx_.set_op_mode(std::move(op), mode); }
  void clear_op_modes() { ctx_.clear_op_modes(); }
  // The grad-ready hook (layer.hpp): ranges come op by op in backward order — the untied head,
  // lnf, then per block from the last to the first mlp/proj, mlp/fc, ln2, attn/proj, attn/qkv,
  // ln1, then wte and wpe (a tied wte only after the embedding's backward, its second write).
  // Every element is reported once per micro-batch. Under sequence parallelism the norm tensors
  // are reported although they still need the caller's sum over tp (sum_norm_grads). An empty
  // function removes the hook.
  void set_grad_ready_hook(GradReadyHook hook) { ctx_.grad_ready_ = std::move(hook); }

  // Deterministic initialisation from the config's seed: each element is a function of (seed,
  // tensor name, element index in the global tensor) only (GPT-2 scheme: N(0, init_std), residual
  // projections scaled by 1/sqrt(2·n_layers), biases 0, norm weights 1: ParamDecl::init).
  void init_parameters();
  // The same values for the elements [first, end) of the flat buffer, written to out[0, end - first).
  void init_parameters(int64_t first, int64_t end, float* out) const;

  // Model FLOPs per trained token of the whole model (layer_list.hpp's flops_per_token).
  double flops_per_token() const { return lockstep::flops_per_token(desc_); }

  void zero_grad();
  // Canonical mode: rounds the exact gradient sums into grads(). Fast mode: nothing to do.
  void finish_grads() { finish_grads(0, num_params()); }
  // The same for the elements [first, end) of the flat buffer only.
  void finish_grads(int64_t first, int64_t end);

  // Whether this model (a pipeline stage: its layers) holds an [inject] site (src/train/inject.hpp):
  // a parameter `param/NAME` or product `gemm/NAME/...` of its own, a tensor one of its layers
  // shows (or its gradient); every other kind of site (optimizer state, messages, checkpoints, none)
  // is on every stage.
  bool holds_site(const std::string& site) const;

  // Pipeline stages of a model with tied embeddings (src/train/pipeline.hpp). The stage with the
  // head but not the embedding computes with a copy of wte (tp-local; empty span elsewhere),
  // outside param_layout() and params()' num_params(): nothing updates or saves it, the caller
  // writes the embedding stage's values into it; its gradient of the step accumulates in
  // tied_copy_grad() (fast mode) or tied_copy_exact() (canonical) until zero_grad().
  std::span<float> tied_copy();
  std::span<const float> tied_copy_grad() const { return ctx_.tied_grad_; }
  const ExactAccumulator& tied_copy_exact() const { return ctx_.tied_exact_; }
  // The embedding's stage: `add` is called once, in the next backward of a step's last
  // micro-batch, with wte's gradient sink, after the embedding added its part and before wte is
  // reported ready — to add the head stage's part.
  void add_to_tied_grad(std::function<void(const GradSink&)> add);

  // The chunks (ModelOptions::chunks): their count, and each one's layers of the list.
  size_t num_chunks() const { return chunks_.size(); }
  const LayerChunk& chunk(size_t c) const { return chunks_[c].range; }
  // Where chunk c's parameters start in the flat buffer.
  int64_t chunk_params_first(size_t c) const { return chunks_[c].params_first; }

  // Forward of micro-batch `mb` (an id of the caller's: distinct among those in flight in the
  // chunk) through chunk `chunk`; the tokens are copied, so the caller's buffers may change after
  // the call. Micro-batch 0 is a step's first: its forward makes the bf16 linears' weight copies
  // from the parameters, which the step's other micro-batches reuse (so the first forward after
  // the parameters change is micro-batch 0's).
  void forward(int64_t mb, const MicroBatch& batch, size_t chunk = 0);
  // Backward of micro-batch `mb` through chunk `chunk` (after its forward there): the loss layer
  // computes the per-token losses with their gradient scaled by dloss (1 / tokens in the global
  // batch) and adds them, chunk by chunk, to loss_sum; parameter gradients accumulate. last_micro:
  // the step's last micro-batch in this chunk (grad-ready hook).
  // With a split backward (ModelOptions::split_backward) the linears' weight gradients wait for
  // backward_weight(mb), and the micro-batch stays in flight until then.
  void backward(int64_t mb, float dloss, ChunkCombiner& loss_sum, bool last_micro, size_t chunk = 0);
  // The weight gradients a split backward of mb left (after backward(mb), before mb's next forward);
  // last_micro as backward's, for these gradients.
  void backward_weight(int64_t mb, bool last_micro, size_t chunk = 0);
  // A chunk after the embedding: where the previous stage's output for mb goes before forward(mb).
  float* stage_input(int64_t mb, size_t chunk = 0);
  // After forward(mb): the chunk's last layer's output of mb (the stream, or a loss layer's logits).
  const float* stage_output(int64_t mb, size_t chunk = 0) const;
  // A chunk before the loss: where the gradient of stage_output(mb) goes before backward(mb).
  float* stage_output_grad() { return stream_grad_[0].data(); }
  // After a backward: the gradient of its chunk's input (a chunk after the embedding).
  const float* stage_input_grad() const { return input_grad_; }
  // Stream tokens of a B-sequence micro-batch here (its stage input and output have these rows).
  int64_t stream_tokens(int64_t B) const { return plan_->stream_tokens(B * desc_.config.seq_len); }

  // One micro-batch of B sequences: forward, loss, backward; parameter gradients accumulate.
  void forward_backward(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                        int64_t B, int64_t token_offset, float dloss, ChunkCombiner& loss_sum);
  // Runs forward_backward over a batch of B sequences in micro-batches of MB (B % MB == 0);
  // first_token is the global index of the batch's first token.
  void forward_backward_batch(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                              int64_t B, int64_t MB, int64_t first_token, float dloss, ChunkCombiner& loss_sum);
  // Forward only; adds the per-token losses to loss_sum.
  void eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, ChunkCombiner& loss_sum);
  // The same for one chunk: a forward of micro-batch mb that keeps nothing for a backward (a chunk
  // after the embedding reads stage_input(mb, chunk) first); the loss layer, where the chunk has
  // it, adds the losses to loss_sum. Returns the chunk's output, valid until the next pass.
  const float* eval_forward(int64_t mb, const MicroBatch& batch, ChunkCombiner& loss_sum, size_t chunk = 0);

 private:
  struct Slot {
    int64_t mb = -1;          // -1: free
    bool input_only = false;  // stage_input(mb) was asked for, forward(mb) not run yet
    Pass pass;
    std::vector<int32_t> inputs, targets;
    std::vector<float> stage_input;
  };
  struct Chunk {
    LayerChunk range;                       // its end within the list
    size_t layer_begin = 0, layer_end = 0;  // its layers in layers_
    int64_t params_first = 0;                // its first parameter in the flat buffer
    std::vector<Slot> slots;
  };
  // The slot of mb in chunk c (stage_input's, or a free one marked input_only).
  Slot& reserve(Chunk& c, int64_t mb);
  Slot& acquire(Chunk& c, int64_t mb, const MicroBatch& batch);
  Slot& find(Chunk& c, int64_t mb);
  const Slot& find(const Chunk& c, int64_t mb) const;
  void run_forward(Chunk& c, Slot& s, bool first_of_step);
  // Layer i's input in chunk c for the micro-batch in slot s: the previous layer's output, the
  // chunk's stage input, or nothing (the embedding reads tokens).
  const float* layer_input(const Chunk& c, const Slot& s, size_t i) const;

  ModelDesc desc_;
  ModelOptions options_;
  int64_t num_params_ = 0;  // of layout_ (params_ may end with a tied copy of wte)
  ModelPlan default_plan_;
  const ModelPlan* plan_;
  LayerContext ctx_;
  int64_t max_batch_;
  std::vector<SeqBlock> seq_;  // the positions of each sequence held here (ModelPlan::sequence)
  std::vector<std::unique_ptr<Layer>> layers_;  // the chunks' layers of desc_.layers, in order
  std::vector<Chunk> chunks_;
  std::vector<float> stream_grad_[2];  // the stream's gradient between layers
  const float* input_grad_ = nullptr;
};

}  // namespace lockstep
