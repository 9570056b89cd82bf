// Where the tensor a tensor-parallel rank hands to the model's hook (gpt.hpp's TensorHook) lies in
// the tensor one device hands to it under the same name: the activation counterpart of
// param_layout.hpp, for gathering shards into global tensors (dumps, verify/dump.hpp).
//
// What Gpt (gpt.cpp, gpt_parallel.cpp) observes on tp rank r of p, by hook name (`grad/` names
// follow the table on their own; `layer/N/` prefixes do not matter):
//   attn/qkv, grad/attn/qkv    (B, T, ·) this rank's heads' q, k and v features: three ranges of
//                              the feature dim [q | k | v] (param_layout's qkv rows)
//   attn/att, grad/attn/att    (B, NH/p, T, T): heads [r·NH/p, (r+1)·NH/p) of dim 1
//   attn/out, grad/attn/out    (B, T, NH·HS/p): features [r·NH·HS/p, ...) of dim 2
//   mlp/fc, grad/mlp/fc        (B, T, ·) GELU: features [r·F/p, ...); SwiGLU: that range of the
//                              gate half and of the up half
//   mlp/act, grad/mlp/act      (B, T, F/p): features [r·F/p, ...)
//   logits, grad/logits        (B, T, V/p): vocabulary [r·V/p, ...)
//   ln1/out ln2/out lnf/out    whole on every rank (gathered over tp under sequence parallelism)
//   losses                     whole on every rank (the vocabulary-parallel cross-entropy's rows)
//   embed/out attn/res mlp/res and the gradients of these and of the norm outputs
//   (grad/ln1/out, grad/ln2/out, grad/lnf/out): whole after the row-parallel reduction; under
//                              sequence parallelism (1, B·T/p, C): block r of the micro-batch's
//                              B·T tokens (flattened, contiguous), so the global tensor is the
//                              blocks concatenated along dim 1 and read as (B, T, C).
// The dims after the batch dim are those of one micro-batch, so the same description holds for
// a step's micro-batches concatenated along dim 0 (the dump's batch tensors).
// Not here: the gather itself (collectives belong to the caller), parameters (param_layout.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "src/model/config.hpp"
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
HookShard hook_shard(const ModelConfig& cfg, TpCoord tp, bool sp, std::string_view name,
                     std::span<const int64_t> local_shape);

// The shape of the global tensor of which `local_shape` is the shard `s`.
std::vector<int64_t> global_hook_shape(const HookShard& s, std::span<const int64_t> local_shape);

// Copies the shard `local` (shape `local_shape`) to its place in `global` (global_hook_shape).
void place_hook_shard(const HookShard& s, std::span<const int64_t> local_shape, const float* local, float* global);

}  // namespace lockstep
