// Tensor-parallel layout checks, the TpGroup over a Communicator, shard gather/scatter
// (see tensor_parallel.hpp).
#include "src/parallel/tensor_parallel.hpp"

#include <algorithm>

#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"
#include "src/parallel/exact_reduce.hpp"

namespace lockstep::parallel {

namespace {

// [0, n) in p near-equal contiguous parts.
ShardPlan even_plan(int64_t n, int p) {
  ShardPlan plan;
  plan.begin.resize(static_cast<size_t>(p) + 1);
  for (int r = 0; r <= p; ++r) plan.begin[static_cast<size_t>(r)] = n * r / p;
  return plan;
}

}  // namespace

void check_tp_layout(const ModelConfig& m, int64_t tp, bool sp, Mode mode, const std::string& source) {
  LS_REQUIRE(!sp, source, ": [parallel] sp = true: sequence parallelism is not implemented yet; use sp = false");
  if (tp == 1) return;
  auto divides = [&](const char* field, int64_t value, const char* why) {
    LS_REQUIRE(value % tp == 0, source, ": [model] ", field, " (", value, ") must be a multiple of [parallel] tp (",
               tp, "): ", why);
  };
  divides("n_heads", m.n_heads, "each rank computes n_heads / tp whole attention heads");
  divides("n_kv_heads", m.n_kv_heads, "each rank holds the key/value heads of its query heads");
  divides("ffn_hidden", m.ffn_width(), "each rank holds ffn_hidden / tp hidden features of the MLP");
  divides("vocab_size", m.vocab_size,
          "each rank holds vocab_size / tp rows of the embedding and the head; pad the vocabulary "
          "(e.g. to a multiple of 64·tp: the extra rows are never inputs or targets)");
  if (mode != Mode::kCanonical) return;
  // Every reduction split across the tp ranks must be cut on canonical chunk boundaries, or the
  // chunk partials (and the bits) would differ from one process's.
  auto aligned = [&](const char* what, int64_t value, const char* reduction) {
    LS_REQUIRE(value / tp % kCanonicalChunk == 0, source, ": canonical mode with tp = ", tp, " needs ", what, " / tp (",
               value / tp, ") to be a multiple of the canonical chunk ", kCanonicalChunk, " (", reduction,
               " is split across the tp ranks); use --train.mode=fast or a smaller tp");
  };
  aligned("d_model", m.d_model, "the attention-output projection's input");
  aligned("the key/value width n_kv_heads·head_size", m.n_kv_heads * m.head_size(), "the QKV input gradient");
  aligned("ffn_hidden", m.ffn_width(), "the MLP output projection's input");
  aligned("vocab_size", m.vocab_size, "the softmax over the vocabulary");
}

uint64_t tp_min_bytes(const ModelConfig& m, int64_t tp, int64_t tokens) {
  const auto p = static_cast<uint64_t>(tp);
  const uint64_t per_value = 8 * (p - 1);  // divided by p below
  const auto values = static_cast<uint64_t>((4 * m.n_layers + 2) * tokens * m.d_model + 3 * tokens);
  return values * per_value / p;
}

void CommTpGroup::all_reduce_exact(const ExactAccumulator& acc, float* x) {
  const ShardPlan plan = even_plan(static_cast<int64_t>(acc.size()), comm_.size());
  shard_.resize(static_cast<size_t>(plan.size(comm_.rank())));
  exact_reduce_scatter(acc, plan, comm_, shard_.data());
  comm_.all_gatherv(shard_.data(), x, plan.sizes(), plan.firsts(), comm::DataType::kF32);
}

void CommTpGroup::all_reduce_sum(float* x, int64_t n) {
  const ShardPlan plan = even_plan(n, comm_.size());
  shard_.resize(static_cast<size_t>(plan.size(comm_.rank())));
  comm_.reduce_scatter(x, shard_.data(), plan.sizes(), comm::DataType::kF32, comm::ReduceOp::kSum);
  comm_.all_gatherv(shard_.data(), x, plan.sizes(), plan.firsts(), comm::DataType::kF32);
}

void CommTpGroup::all_reduce_max(float* x, int64_t n) {
  comm_.all_reduce(x, x, n, comm::DataType::kF32, comm::ReduceOp::kMax);
}

std::vector<float> gather_global(const ModelConfig& model, const std::vector<ParamTensor>& local,
                                 const float* local_data, comm::Communicator& tp) {
  const std::vector<ParamTensor> global = build_param_layout(model);
  const int p = tp.size();
  const int64_t n = local.back().offset + local.back().numel;  // the same on every tp rank
  std::vector<float> all(static_cast<size_t>(n) * static_cast<size_t>(p));
  tp.all_gather(local_data, all.data(), n, comm::DataType::kF32);
  std::vector<float> out(static_cast<size_t>(global.back().offset + global.back().numel));
  for (int q = 0; q < p; ++q) {
    const std::vector<ParamTensor> theirs = build_param_layout(model, {p, q});
    const float* data = all.data() + static_cast<size_t>(q) * static_cast<size_t>(n);
    for (size_t t = 0; t < global.size(); ++t) {
      const ParamTensor& g = global[t];
      const ParamTensor& s = theirs[t];
      for (int64_t i = 0; i < s.numel; ++i) out[static_cast<size_t>(g.offset + s.global_index(i))] = data[s.offset + i];
    }
  }
  return out;
}

void take_local(const ModelConfig& model, const std::vector<ParamTensor>& local, const float* global_data,
                float* local_data) {
  const std::vector<ParamTensor> global = build_param_layout(model);
  LS_CHECK(global.size() == local.size(), "layouts of ", global.size(), " and ", local.size(), " tensors");
  for (size_t t = 0; t < global.size(); ++t) {
    const ParamTensor& s = local[t];
    for (int64_t i = 0; i < s.numel; ++i) local_data[s.offset + i] = global_data[global[t].offset + s.global_index(i)];
  }
}

nlohmann::json describe_shards(const ModelConfig& model, int64_t tp) {
  std::vector<std::vector<ParamTensor>> ranks;
  for (int64_t q = 0; q < tp; ++q) ranks.push_back(build_param_layout(model, {tp, q}));
  nlohmann::json out = nlohmann::json::array();
  for (size_t t = 0; t < ranks[0].size(); ++t) {
    const ParamTensor& first = ranks[0][t];
    nlohmann::json entry = {{"name", first.name}, {"global_shape", first.global_shape}};
    if (first.replicated()) {
      entry["split_dim"] = nullptr;  // every tp rank holds the whole tensor
    } else {
      entry["split_dim"] = first.split_dim;
      nlohmann::json per_rank = nlohmann::json::array();
      for (const auto& layout : ranks) per_rank.push_back(layout[t].ranges);
      entry["ranges"] = per_rank;  // per tp rank: [first, end) along split_dim, concatenated locally
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace lockstep::parallel
