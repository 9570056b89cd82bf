// Tensor-parallel shards of the model's hook tensors (see hook_layout.hpp).
#include "src/model/hook_layout.hpp"

#include <algorithm>
#include <string>

#include "src/core/check.hpp"

namespace lockstep {

HookShard hook_shard(const ModelDesc& desc, TpCoord tp, bool sp, std::string_view name,
                     std::span<const int64_t> local_shape) {
  const int64_t p = tp.size, r = tp.rank;
  const bool grad = name.starts_with("grad/");
  const HookDecl* h = find_hook(desc, name);
  LS_CHECK(h != nullptr, name, ": not a hook name of the model");
  auto check_held = [&](int dim, int64_t held) {
    LS_CHECK(static_cast<int>(local_shape.size()) > dim, name, ": a rank-", local_shape.size(),
             " tensor has no dim ", dim);
    LS_CHECK(held == local_shape[static_cast<size_t>(dim)], name, ": dim ", dim, " holds ",
             local_shape[static_cast<size_t>(dim)], " elements, tp rank ", r, " of ", p, " should hold ", held);
  };
  if (p == 1) return {};
  switch (h->region) {
    case HookRegion::kWhole:
      return {};
    case HookRegion::kSplit: {
      HookShard s{h->split_dim, {}, 0, 0};
      int64_t held = 0;
      for (int64_t n : h->segments) {
        s.ranges.emplace_back(s.global_extent + r * n / p, s.global_extent + (r + 1) * n / p);
        s.global_extent += n;
        held += n / p;
      }
      check_held(h->split_dim, held);
      return s;
    }
    case HookRegion::kNormOut:
    case HookRegion::kStream:
      break;
  }
  // Norm outputs are gathered before use; their gradients, like the residual stream, are not.
  if (!sp || (h->region == HookRegion::kNormOut && !grad)) return {};
  LS_CHECK(local_shape.size() == 3, name, ": expected (micro-batches, tokens, d_model) under sequence parallelism");
  const int64_t tokens = p * local_shape[1];
  check_held(1, tokens / p);
  HookShard s{1, {{r * tokens / p, (r + 1) * tokens / p}}, tokens, desc.config.seq_len};
  LS_CHECK(s.global_extent % s.tokens_per_sequence == 0, name, ": ", s.global_extent,
           " tokens are not whole sequences of ", s.tokens_per_sequence);
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
