// Where the tensor a tensor-parallel rank hands to the model's hook (layer.hpp's TensorHook) lies in
// the tensor one device hands to it under the same name: the activation counterpart of
// param_layout.hpp, for gathering shards into global tensors (dumps, verify/core/dump.hpp), read off
// each hook's declaration (layer_list.hpp's HookDecl) on tp rank r of p:
//   kSplit    split along split_dim in its segments, rank r holding part r of each (attn/qkv:
//             this rank's heads' q, k and v features; attn/att: its heads; mlp/fc, mlp/act: its
//             hidden features, of both SwiGLU halves; logits: its vocabulary rows)
//   kNormOut  whole on every rank (gathered over tp under sequence parallelism); its gradient as
//             kStream
//   kStream   the residual stream (embed/out, attn/res, mlp/res) and its gradient: whole after the
//             row-parallel reduction; under sequence parallelism (1, B·T/p, C): block r of the
//             micro-batch's B·T tokens (flattened, contiguous), so the global tensor is the blocks
//             concatenated along dim 1 and read as (B, T, C)
//   kWhole    whole on every rank (losses: the vocabulary-parallel cross-entropy's rows)
// The dims after the batch dim are those of one micro-batch, so the same description holds for
// a step's micro-batches concatenated along dim 0 (the dump's batch tensors).
// Not here: the gather itself (collectives belong to the caller), parameters (param_layout.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "src/model/layer_list.hpp"
#include "src/model/param_layout.hpp"

namespace lockstep {

struct HookShard {
  // -1: every tp rank observes the whole tensor (the global tensor is any rank's copy).
  int split_dim = -1;
  // Global index ranges [first, end) along split_dim this rank holds, concatenated in local order.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t global_extent = 0;  // the global tensor's size along split_dim
  // > 0: split_dim is the flattened tokens of each micro-batch (sequence parallelism); the global
  // tensor reads them as (·, tokens_per_sequence, ·) sequences instead.
  int64_t tokens_per_sequence = 0;

  bool whole() const { return split_dim < 0; }
};

// The shard of hook tensor `name` (local shape `local_shape`) on tp rank tp.rank. sp: sequence
// parallelism. InternalError for a name the model does not observe or a shape that does not fit it.
HookShard hook_shard(const ModelDesc& desc, TpCoord tp, bool sp, std::string_view name,
                     std::span<const int64_t> local_shape);

// The shape of the global tensor of which `local_shape` is the shard `s`.
std::vector<int64_t> global_hook_shape(const HookShard& s, std::span<const int64_t> local_shape);

// Copies the shard `local` (shape `local_shape`) to its place in `global` (global_hook_shape).
void place_hook_shard(const HookShard& s, std::span<const int64_t> local_shape, const float* local, float* global);

}  // namespace lockstep
