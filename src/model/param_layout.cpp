// Parameter layout and its tensor-parallel split (see param_layout.hpp).
#include "src/model/param_layout.hpp"

#include "src/core/check.hpp"

namespace lockstep {

int64_t ParamTensor::global_numel() const {
  int64_t n = 1;
  for (auto d : global_shape) n *= d;
  return n;
}

int64_t ParamTensor::global_index(int64_t i) const {
  if (replicated()) return i;
  // Local index along the split dim -> global index through the concatenated ranges.
  auto map = [&](int64_t local) {
    for (const auto& [first, end] : ranges) {
      if (local < end - first) return first + local;
      local -= end - first;
    }
    throw InternalError(str_cat(name, ": local index beyond its ranges"));
  };
  if (split_dim == 0) {
    int64_t inner = 1;
    for (size_t d = 1; d < global_shape.size(); ++d) inner *= global_shape[d];
    return map(i / inner) * inner + i % inner;
  }
  LS_CHECK(split_dim == 1 && shape.size() == 2, name, ": split dim ", split_dim);
  return (i / shape[1]) * global_shape[1] + map(i % shape[1]);
}

std::vector<ParamTensor> build_param_layout(const ModelConfig& cfg, TpCoord tp) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size, T = cfg.seq_len, F = cfg.ffn_width();
  const int64_t p = tp.size, r = tp.rank;
  const bool swiglu = cfg.ffn == FfnKind::kSwiglu, ln = cfg.norm == NormKind::kLayerNorm;
  const int64_t fc_out = swiglu ? 2 * F : F;
  const int64_t KV = cfg.n_kv_heads * cfg.head_size();
  LS_CHECK(p >= 1 && r >= 0 && r < p && V % p == 0 && C % p == 0 && KV % p == 0 && F % p == 0,
           "tensor-parallel split of V=", V, " C=", C, " KV=", KV, " F=", F, " over ", p, " ranks");
  // This rank's part of [0, n) split in p equal parts, offset by `base`.
  auto part = [&](int64_t n, int64_t base) { return std::pair{base + r * n / p, base + (r + 1) * n / p}; };
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  const Ranges qkv_rows = {part(C, 0), part(KV, C), part(KV, C + KV)};
  const Ranges fc_rows = swiglu ? Ranges{part(F, 0), part(F, F)} : Ranges{part(F, 0)};
  const Ranges vocab_rows = {part(V, 0)}, proj_cols = {part(C, 0)}, fcproj_cols = {part(F, 0)};

  std::vector<ParamTensor> layout;
  int64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> global, bool decay, int dim = -1,
                 Ranges ranges = {}) {
    ParamTensor t{name, global, offset, 0, decay, false, global, dim, std::move(ranges)};
    if (dim >= 0) {
      int64_t held = 0;
      for (const auto& [first, end] : t.ranges) held += end - first;
      t.shape[static_cast<size_t>(dim)] = held;
    }
    t.numel = 1;
    for (auto d : t.shape) t.numel *= d;
    offset += t.numel;
    layout.push_back(std::move(t));
  };
  auto add_norm = [&](const std::string& name) {
    add(name, {C}, false);
    layout.back().norm = true;
  };
  // Canonical order: the order of the forward pass.
  add("wte", {V, C}, true, 0, vocab_rows);
  if (cfg.pos == PosKind::kLearned) add("wpe", {T, C}, true);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string pre = "layer/" + std::to_string(l) + "/";
    add_norm(pre + "ln1/weight");
    if (ln) add_norm(pre + "ln1/bias");
    add(pre + "attn/qkv/weight", {cfg.qkv_width(), C}, true, 0, qkv_rows);
    if (cfg.bias) add(pre + "attn/qkv/bias", {cfg.qkv_width()}, false, 0, qkv_rows);
    add(pre + "attn/proj/weight", {C, C}, true, 1, proj_cols);
    if (cfg.bias) add(pre + "attn/proj/bias", {C}, false);
    add_norm(pre + "ln2/weight");
    if (ln) add_norm(pre + "ln2/bias");
    add(pre + "mlp/fc/weight", {fc_out, C}, true, 0, fc_rows);
    if (cfg.bias) add(pre + "mlp/fc/bias", {fc_out}, false, 0, fc_rows);
    add(pre + "mlp/proj/weight", {C, F}, true, 1, fcproj_cols);
    if (cfg.bias) add(pre + "mlp/proj/bias", {C}, false);
  }
  add_norm("lnf/weight");
  if (ln) add_norm("lnf/bias");
  if (!cfg.tie_embeddings) add("lm_head/weight", {V, C}, true, 0, vocab_rows);
  // One rank holds everything: nothing is split.
  if (p == 1) {
    for (auto& t : layout) t.split_dim = -1, t.ranges.clear();
  }
  return layout;
}

}  // namespace lockstep
