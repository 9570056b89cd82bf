// The model as an ordered list of layers — the description everything else is generated from.
//
// A GPT is: embedding, then per block an attention sub-layer and an MLP sub-layer (each pre-norm,
// each adding its branch to the residual stream), a final norm, and the head with the loss. Each
// entry names its kind, the names it declares, its dims, and what it declares:
//   params  its parameters (name, global shape, dtype, weight decay, initialisation, and the dim
//           tensor parallelism splits, cut into segments such as [q | k | v]);
//   hooks   the tensors it shows to observers (hook names as `layer/3/attn/qkv`), with where a
//           tensor-parallel rank's shard of each lies in the one-device tensor;
//   ops     for each tensor it computes, forward or gradient, the op and its inputs (the op graph
//           of `lockstep diff` and `lockstep bisect`).
// The parameter layout (checkpoint and model-hash order), the hook layout of dumps, the op graph,
// the inject sites and the reference model (reference/gpt.hpp) are read off this list; the layer
// kinds declare and implement themselves in src/model/layers/ (one file each).
// Pure description: no kernels, no buffers, no ranks. Not here: running the layers
// (src/model/model.hpp), splitting them over ranks (src/parallel/tp_plan.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/model/config.hpp"

namespace lockstep {

enum class LayerKind : uint8_t { kEmbedding, kAttention, kMlp, kFinalNorm, kHead, kMoe };

std::string_view layer_kind_name(LayerKind k);

// The dims a layer computes with (kernels/ops/README.md's letters). A layer's `dims` are the whole
// model's; a tensor-parallel plan hands each rank's layer its share of NH, NKV, F and V.
struct LayerDims {
  int64_t V = 0;   // vocabulary (embedding, head)
  int64_t T = 0;   // sequence length
  int64_t C = 0;   // model width
  int64_t NH = 0;  // query heads
  int64_t NKV = 0; // key/value heads
  int64_t HS = 0;  // head size
  int64_t F = 0;   // MLP hidden width

  int64_t qkv_width() const { return (NH + 2 * NKV) * HS; }
};

// What a parameter is, for the policies that treat kinds of tensors alike (AdamW's weight decay:
// src/optim/decay_policy.hpp; sequence parallelism's norm gradients).
enum class ParamClass : uint8_t {
  kMatrix,     // a linear's weight (the head's too)
  kEmbedding,  // wte, wpe
  kNorm,       // a norm's weight or bias (applied per token: sequence parallelism leaves each
               // rank the gradient of its own tokens)
  kBias,       // a linear's bias
};
inline constexpr int kNumParamClasses = 4;
std::string_view param_class_name(ParamClass c);  // "matrices", "embeddings", "norms", "biases"

enum class ParamInit : uint8_t {
  kOnes,    // norm weights
  kZeros,   // biases
  kNormal,  // N(0, (init_std · init_scale)²) per element, keyed by (seed, name, global index)
};

struct ParamDecl {
  std::string name;            // e.g. "layer/0/attn/qkv/weight"
  std::vector<int64_t> shape;  // the global tensor
  DType dtype = DType::kF32;
  ParamClass klass = ParamClass::kMatrix;
  bool matmul = false;         // multiplies activations: 6 FLOPs per element per trained token
  double token_share = 1.0;    // of the tokens a matmul multiplies (an expert's: top_k / experts)
  bool fp32_only = false;      // a linear the precision recipe leaves in fp32 (a MoE router: its
                               // scores choose the experts)
  ParamInit init = ParamInit::kNormal;
  float init_scale = 1.0f;     // GPT-2: 1/sqrt(2·n_layers) for projections into the residual stream
  // Tensor parallelism: the dim split over the tp ranks (-1: every rank holds the whole tensor),
  // made of `segments` (global extents along it, in order) each split in equal parts: rank r of p
  // holds part r of every segment, concatenated. One segment unless the tensor fuses several.
  int split_dim = -1;
  std::vector<int64_t> segments = {};
  // Expert parallelism: the routed expert (of `experts` in its layer) whose parameter this is; -1
  // for every other tensor (every ep rank holds those).
  int64_t expert = -1, experts = 0;
};

// Where a tp rank's hook tensor lies in the one-device tensor of the same name (hook_layout.hpp).
enum class HookRegion : uint8_t {
  kSplit,   // split along split_dim in `segments`, like the parameter whose features it holds
  kStream,  // the residual stream: whole, or under sequence parallelism a contiguous block of the
            // micro-batch's tokens; its gradient the same
  kNormOut, // a norm's output: whole (gathered under sequence parallelism); its gradient kStream
  kWhole,   // whole on every rank, forward and gradient
};

struct HookDecl {
  std::string name;  // without `grad/`
  HookRegion region = HookRegion::kWhole;
  int split_dim = -1;
  std::vector<int64_t> segments = {};
  bool op_site = false;  // the forward output of one op, whose mode Model::set_op_mode can switch
};

// The op that computes tensor `tensor` (a hook name, `grad/...` for gradients, or `loss`).
struct OpDecl {
  std::string tensor;
  std::string op;                    // e.g. "linear (qkv) + RoPE"
  std::vector<std::string> inputs;   // hook tensors it reads
  std::string other;                 // inputs that are not hook tensors: parameters, tokens, targets
};

struct LayerDesc {
  LayerKind kind = LayerKind::kEmbedding;
  std::string prefix;      // of its names: "layer/3/" in block 3, "" outside the blocks
  std::string input;       // hook name of the tensor it reads ("" for the embedding: tokens)
  std::string output;      // hook name of the tensor it writes (a loss layer: its logits)
  int64_t block = -1;      // the transformer block of an attention or MLP sub-layer
  LayerDims dims;
  NormKind norm = NormKind::kLayerNorm;
  float norm_eps = 1e-5f;
  FfnKind ffn = FfnKind::kGelu;
  bool bias = true;        // linear biases
  PosKind pos = PosKind::kLearned;
  double rope_theta = 10000.0;
  bool tied = true;        // head: its weight is the embedding's wte
  float residual_scale = 1.0f;  // init_scale of the projections into the residual stream
  double activation_flops = 0;  // FLOPs per token between activations (attention: scores, values)
  // A MoE layer (ModelConfig's moe_*): its experts are MLPs of dims.F features.
  int64_t experts = 0, top_k = 0;
  RouterKind router = RouterKind::kSoftmax;
  bool normalize_gates = true;
  double capacity_factor = 0;
  float aux_weight = 0;
  bool selection_bias = false;  // experts chosen by score + a bias the trainer moves (moe_bias_update)
  int64_t shared_F = 0;         // hidden features of the shared experts' MLP (0: none)

  // What it declares (filled by declare_layers from its kind's file in src/model/layers/).
  std::vector<ParamDecl> params;
  std::vector<HookDecl> hooks;
  std::vector<OpDecl> ops;
};

// The whole model: model-wide settings and the list.
struct ModelDesc {
  ModelConfig config;  // seed, init_std, seq_len, vocabulary; per-layer options are the layers'
  std::vector<LayerDesc> layers;

  int64_t n_blocks() const;  // transformer blocks (attention sub-layers)
};

// GPT's list for a [model] section: embedding, n_layers × (attention, MLP or MoE), final norm,
// head; declared. The config is validated.
ModelDesc describe_model(const ModelConfig& cfg);

// (Re)fills every layer's params, hooks and ops from its kind and dims, and links each layer's
// input to the previous layer's output: after editing a list (another MLP width in one block, a
// layer added), call it again.
void declare_layers(ModelDesc& desc);

// An MLP's (or expert's) fc outputs for F hidden features, and their segments along the features
// tensor parallelism splits: SwiGLU's fc rows are [gate | up] (a rank holds the same features of
// both), GELU's one block.
int64_t ffn_fc_width(const LayerDesc& layer, int64_t F);
std::vector<int64_t> ffn_fc_segments(const LayerDesc& layer, int64_t F);

// A parameter's elements (the global tensor's).
int64_t param_numel(const ParamDecl& p);

// Every parameter in canonical order (the order of the forward pass: checkpoints, model hash).
std::vector<const ParamDecl*> model_params(const ModelDesc& desc);

// The hook a name (with or without `grad/`) refers to, or nullptr.
const HookDecl* find_hook(const ModelDesc& desc, std::string_view name);

// The op that computes `tensor`, or nullptr.
const OpDecl* find_op(const ModelDesc& desc, std::string_view tensor);

// Whether `site` is an op site (HookDecl::op_site) of this model.
bool is_op_site(const ModelDesc& desc, std::string_view site);

// The op sites, as a list for messages ("embed/out, layer/N/ln1/out, ...": blocks shown once as N).
std::string op_sites_text(const ModelDesc& desc);

// Model FLOPs per trained token: 6·N (N = parameters in matmuls: the linears and the head, a tied
// head counted once) + each layer's activation_flops (12·C·T per attention sub-layer: scores and
// values): the PaLM/Megatron convention.
double flops_per_token(const ModelDesc& desc);
// One layer's part of it (a tied head's weight counts where it is declared, with the embedding).
double layer_flops_per_token(const LayerDesc& layer);

}  // namespace lockstep
