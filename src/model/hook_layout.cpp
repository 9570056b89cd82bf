// Tensor-parallel shards of the model's hook tensors (see hook_layout.hpp).
#include "src/model/hook_layout.hpp"

#include <algorithm>
#include <string>

#include "src/core/check.hpp"

namespace lockstep {

namespace {

// The op of a hook name without `grad/` and `layer/N/`.
std::string_view op_of(std::string_view name) {
  if (name.starts_with("grad/")) name.remove_prefix(5);
  if (name.starts_with("layer/")) {
    const size_t slash = name.find('/', 6);
    if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
  }
  return name;
}

bool one_of(std::string_view op, std::initializer_list<std::string_view> ops) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

}  // namespace

HookShard hook_shard(const ModelConfig& cfg, TpCoord tp, bool sp, std::string_view name,
                     std::span<const int64_t> local_shape) {
  const int64_t p = tp.size, r = tp.rank;
  const bool grad = name.starts_with("grad/");
  const std::string_view op = op_of(name);
  // This rank's part of [0, n) split in p equal parts, offset by `base` (param_layout's split).
  auto part = [&](int64_t n, int64_t base) { return std::pair{base + r * n / p, base + (r + 1) * n / p}; };
  auto split = [&](int dim, int64_t extent, std::vector<std::pair<int64_t, int64_t>> ranges) {
    LS_CHECK(static_cast<int>(local_shape.size()) > dim, name, ": a rank-", local_shape.size(),
             " tensor has no dim ", dim);
    int64_t held = 0;
    for (const auto& [first, end] : ranges) held += end - first;
    LS_CHECK(held == local_shape[static_cast<size_t>(dim)], name, ": dim ", dim, " holds ",
             local_shape[static_cast<size_t>(dim)], " elements, tp rank ", r, " of ", p, " should hold ", held);
    return HookShard{dim, std::move(ranges), extent, 0};
  };
  if (p == 1) return {};

  const int64_t HS = cfg.head_size(), Q = cfg.n_heads * HS, KV = cfg.n_kv_heads * HS, F = cfg.ffn_width();
  if (op == "attn/qkv") return split(2, Q + 2 * KV, {part(Q, 0), part(KV, Q), part(KV, Q + KV)});
  if (op == "attn/att") return split(1, cfg.n_heads, {part(cfg.n_heads, 0)});
  if (op == "attn/out") return split(2, Q, {part(Q, 0)});
  if (op == "mlp/fc") {
    if (cfg.ffn == FfnKind::kSwiglu) return split(2, 2 * F, {part(F, 0), part(F, F)});
    return split(2, F, {part(F, 0)});
  }
  if (op == "mlp/act") return split(2, F, {part(F, 0)});
  if (op == "logits") return split(2, cfg.vocab_size, {part(cfg.vocab_size, 0)});
  if (op == "losses") return {};
  const bool norm_out = one_of(op, {"ln1/out", "ln2/out", "lnf/out"});
  const bool residual = one_of(op, {"embed/out", "attn/res", "mlp/res"});
  LS_CHECK(norm_out || residual, name, ": not a hook name of the model");
  // Norm outputs are gathered before use; their gradients, like the residual stream, are not.
  if (!sp || (norm_out && !grad)) return {};
  LS_CHECK(local_shape.size() == 3, name, ": expected (micro-batches, tokens, d_model) under sequence parallelism");
  HookShard s = split(1, p * local_shape[1], {part(p * local_shape[1], 0)});
  s.tokens_per_sequence = cfg.seq_len;
  LS_CHECK(s.global_extent % cfg.seq_len == 0, name, ": ", s.global_extent, " tokens are not whole sequences of ",
           cfg.seq_len);
  return s;
}

std::vector<int64_t> global_hook_shape(const HookShard& s, std::span<const int64_t> local_shape) {
  std::vector<int64_t> shape(local_shape.begin(), local_shape.end());
  if (s.whole()) return shape;
  shape[static_cast<size_t>(s.split_dim)] = s.global_extent;
  if (s.tokens_per_sequence > 0) {
    // (micro-batches, tokens, ...) -> (sequences, tokens_per_sequence, ...): the same elements.
    LS_CHECK(s.split_dim == 1, "token blocks split dim 1");
    shape[0] *= s.global_extent / s.tokens_per_sequence;
    shape[1] = s.tokens_per_sequence;
  }
  return shape;
}

void place_hook_shard(const HookShard& s, std::span<const int64_t> local_shape, const float* local, float* global) {
  int64_t numel = 1;
  for (int64_t d : local_shape) numel *= d;
  if (s.whole()) {
    std::copy(local, local + numel, global);
    return;
  }
  // Both tensors as (outer, extent along split_dim, inner); the tokens' reshape does not move elements.
  const auto dim = static_cast<size_t>(s.split_dim);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dim; ++d) outer *= local_shape[d];
  for (size_t d = dim + 1; d < local_shape.size(); ++d) inner *= local_shape[d];
  const int64_t held = local_shape[dim];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t at = 0;  // local index along split_dim
    for (const auto& [first, end] : s.ranges) {
      std::copy(local + (o * held + at) * inner, local + (o * held + at + end - first) * inner,
                global + (o * s.global_extent + first) * inner);
      at += end - first;
    }
  }
}

}  // namespace lockstep
