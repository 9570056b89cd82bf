// The model's parameter tensors as one rank holds them: names, shapes, places in the flat buffer,
// and under tensor parallelism the part of each global tensor the rank holds — read off the layer
// list's declarations (layer_list.hpp), in its order.
//
// A declared split (ParamDecl::split_dim and segments) gives tp rank r of p part r of every
// segment along the split dim, concatenated; the parts are [r·n/p, (r+1)·n/p) of a segment of n.
// Megatron-LM's split follows from what the layers declare:
//   column-parallel (split along dim 0, the output features, and the bias):
//     attn/qkv   the q, k and v rows of this rank's heads: three segments [q | k | v]
//     mlp/fc     GELU: rows [r·F/tp, (r+1)·F/tp); SwiGLU: those rows of the gate and of the up half
//   row-parallel (split along dim 1, the input features):
//     attn/proj, mlp/proj   columns [r·C/tp, ...) and [r·F/tp, ...); their biases are replicated
//   vocabulary-parallel: wte (and an untied lm_head): rows [r·V/tp, (r+1)·V/tp)
//   replicated: norm weights and biases, wpe, the row-parallel biases.
// A rank's local tensor is the concatenation, along the split dim, of its ranges of the global
// tensor; local tensors follow the canonical order of the global layout, so the flat buffer of
// one rank is that rank's shard of every tensor, back to back.
// Not here: checking that a split is valid for a config (src/parallel/tensor_parallel.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/model/config.hpp"
#include "src/model/layer_list.hpp"

namespace lockstep {

// Local elements [local, local + length) of a tensor, whose global indices are
// [global, global + length).
struct IndexRun {
  int64_t local = 0, global = 0, length = 0;
};

struct ParamTensor {
  std::string name;            // e.g. "layer/0/attn/qkv/weight"
  std::vector<int64_t> shape;  // this rank's tensor
  int64_t offset = 0;          // first element in the flat buffer
  int64_t numel = 0;
  ParamClass klass = ParamClass::kMatrix;  // what it is (weight decay follows it: src/optim/decay_policy.hpp)
  DType dtype = DType::kF32;
  ParamInit init = ParamInit::kNormal;
  float init_scale = 1.0f;
  // Tensor parallelism: the global tensor, and the split dim (-1: replicated on every tp rank,
  // shape == global_shape) with the global index ranges [first, end) this rank holds along it.
  std::vector<int64_t> global_shape;
  int split_dim = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  // Expert parallelism: the routed expert this tensor belongs to, of `experts` in its layer (-1:
  // not an expert's; every ep rank holds it).
  int64_t expert = -1, experts = 0;

  bool replicated() const { return split_dim < 0; }
  bool is_expert() const { return expert >= 0; }
  // A norm's weight or bias: under sequence parallelism each tp rank applies it to its own tokens,
  // so its gradient covers only those.
  bool is_norm() const { return klass == ParamClass::kNorm; }
  int64_t global_numel() const;
  // Row-major index in the global tensor of local element i.
  int64_t global_index(int64_t i) const;
  // The local elements [first, end) as the fewest runs of consecutive global indices, in order.
  std::vector<IndexRun> global_runs(int64_t first, int64_t end) const;
};

struct TpCoord {
  int64_t size = 1;
  int64_t rank = 0;
};

// Expert parallelism: ep rank `rank` of `size` holds experts [rank·E/size, (rank+1)·E/size) of
// every MoE layer of E routed experts (size divides E).
struct EpCoord {
  int64_t size = 1;
  int64_t rank = 0;
  int64_t owner(const ParamTensor& t) const { return t.expert * size / t.experts; }
};

// The tensors of tp rank tp.rank, in the canonical order (that of the forward pass): every layer's
// declared parameters, or those of layers [first_layer, end_layer) (a pipeline stage). The split
// segments must divide by tp.size (src/parallel/tensor_parallel.hpp checks a config's).
std::vector<ParamTensor> build_param_layout(const ModelDesc& desc, TpCoord tp = {}, size_t first_layer = 0,
                                            size_t end_layer = SIZE_MAX);
// The same for the layer list of a [model] section.
std::vector<ParamTensor> build_param_layout(const ModelConfig& cfg, TpCoord tp = {});

// `layout` without the routed experts' tensors that ep rank ep.rank does not hold, offsets packed
// again (the order of the rest kept). ep rank layouts then have the same shapes in the same order.
std::vector<ParamTensor> hold_experts(std::vector<ParamTensor> layout, EpCoord ep);

}  // namespace lockstep
