// Parameter layout and its tensor-parallel split (see param_layout.hpp).
#include "src/model/param_layout.hpp"

#include <algorithm>

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

std::vector<IndexRun> ParamTensor::global_runs(int64_t first, int64_t end) const {
  std::vector<IndexRun> runs;
  // Local [l0, l1) maps to global [g0, g0 + l1 - l0): the part inside [first, end), merged with the
  // run before where the two continue each other.
  const auto add = [&](int64_t l0, int64_t l1, int64_t g0) {
    const int64_t a = std::max(l0, first), b = std::min(l1, end);
    if (a >= b) return;
    const int64_t g = g0 + (a - l0);
    if (!runs.empty() && runs.back().local + runs.back().length == a && runs.back().global + runs.back().length == g) {
      runs.back().length += b - a;
    } else {
      runs.push_back({a, g, b - a});
    }
  };
  if (replicated()) {
    add(0, numel, 0);
    return runs;
  }
  if (split_dim == 0) {
    int64_t inner = 1;
    for (size_t d = 1; d < global_shape.size(); ++d) inner *= global_shape[d];
    int64_t local_row = 0;
    for (const auto& [g_first, g_end] : ranges) {
      add(local_row * inner, (local_row + g_end - g_first) * inner, g_first * inner);
      local_row += g_end - g_first;
    }
    return runs;
  }
  LS_CHECK(split_dim == 1 && shape.size() == 2, name, ": split dim ", split_dim);
  for (int64_t row = std::max<int64_t>(first, 0) / shape[1]; row < shape[0] && row * shape[1] < end; ++row) {
    int64_t local_col = 0;
    for (const auto& [g_first, g_end] : ranges) {
      add(row * shape[1] + local_col, row * shape[1] + local_col + (g_end - g_first), row * global_shape[1] + g_first);
      local_col += g_end - g_first;
    }
  }
  return runs;
}

std::vector<ParamTensor> build_param_layout(const ModelDesc& desc, TpCoord tp, size_t first_layer, size_t end_layer) {
  const int64_t p = tp.size, r = tp.rank;
  LS_CHECK(p >= 1 && r >= 0 && r < p, "tensor-parallel rank ", r, " of ", p);
  std::vector<ParamTensor> layout;
  int64_t offset = 0;
  for (size_t l = first_layer; l < std::min(end_layer, desc.layers.size()); ++l) {
    for (const ParamDecl& d : desc.layers[l].params) {
      ParamTensor t{d.name, d.shape, offset, 0, d.klass, d.dtype, d.init, d.init_scale, d.shape, -1, {},
                    d.expert, d.experts};
      if (p > 1 && d.split_dim >= 0) {
        t.split_dim = d.split_dim;
        int64_t base = 0, held = 0;
        for (int64_t n : d.segments) {
          LS_CHECK(n % p == 0, d.name, ": a segment of ", n, " along dim ", d.split_dim, " does not split over ", p,
                   " ranks");
          t.ranges.emplace_back(base + r * n / p, base + (r + 1) * n / p);
          base += n;
          held += n / p;
        }
        LS_CHECK(base == d.shape[static_cast<size_t>(d.split_dim)], d.name, ": segments cover ", base, " of ",
                 d.shape[static_cast<size_t>(d.split_dim)]);
        t.shape[static_cast<size_t>(d.split_dim)] = held;
      }
      t.numel = 1;
      for (auto s : t.shape) t.numel *= s;
      offset += t.numel;
      layout.push_back(std::move(t));
    }
  }
  return layout;
}

std::vector<ParamTensor> build_param_layout(const ModelConfig& cfg, TpCoord tp) {
  return build_param_layout(describe_model(cfg), tp);
}

std::vector<ParamTensor> hold_experts(std::vector<ParamTensor> layout, EpCoord ep) {
  if (ep.size == 1) return layout;
  std::vector<ParamTensor> held;
  int64_t offset = 0;
  for (ParamTensor& t : layout) {
    if (t.is_expert() && ep.owner(t) != ep.rank) continue;
    t.offset = offset;
    offset += t.numel;
    held.push_back(std::move(t));
  }
  return held;
}

}  // namespace lockstep
