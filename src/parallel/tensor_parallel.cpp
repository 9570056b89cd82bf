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

void check_tp_layout(const ModelConfig& m, int64_t tp, bool sp, int64_t micro_tokens, Mode mode,
                     const std::string& source) {
  LS_REQUIRE(!sp || tp > 1, source, ": [parallel] sp = true needs tp > 1 (sequence parallelism splits the tokens of "
             "the norm and residual regions over the tensor-parallel ranks)");
  if (tp == 1) return;
  if (sp) {
    LS_REQUIRE(micro_tokens % tp == 0, source, ": sequence parallelism needs a rank's micro-batch of ", micro_tokens,
               " tokens to be a multiple of [parallel] tp (", tp, ")");
    LS_REQUIRE(mode != Mode::kCanonical || micro_tokens / tp % kCanonicalChunk == 0, source,
               ": canonical mode with sequence parallelism needs a rank's micro-batch tokens / tp (", micro_tokens,
               " / ", tp, " = ", micro_tokens / tp, ") to be a multiple of the canonical chunk ", kCanonicalChunk,
               " (the norm weights' gradients are token reductions split across the tp ranks); choose a larger "
               "micro_batch_size or seq_len, or sp = false");
  }
  auto divides = [&](const char* field, int64_t value, const char* why) {
    LS_REQUIRE(value % tp == 0, source, ": [model] ", field, " (", value, ") must be a multiple of [parallel] tp (",
               tp, "): ", why);
  };
  divides("n_heads", m.n_heads, "each rank computes n_heads / tp whole attention heads");
  divides("n_kv_heads", m.n_kv_heads, "each rank holds the key/value heads of its query heads");
  divides("ffn_hidden", m.ffn_width(), "each rank holds ffn_hidden / tp hidden features of the MLP");
  if (m.moe_experts > 0) {
    divides("moe_ffn_hidden", m.moe_ffn_width(), "each rank holds moe_ffn_hidden / tp hidden features of every expert");
  }
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
  if (m.moe_experts > 0) aligned("moe_ffn_hidden", m.moe_ffn_width(), "an expert's output projection's input");
  aligned("vocab_size", m.vocab_size, "the softmax over the vocabulary");
}

uint64_t tp_min_bytes(const ModelConfig& m, int64_t tp, bool sp, int64_t tokens) {
  const auto p = static_cast<uint64_t>(tp);
  const uint64_t per_value = 8 * (p - 1);  // divided by p below
  auto values = static_cast<uint64_t>((4 * m.n_layers + 2) * tokens * m.d_model + 3 * tokens);
  if (sp) {
    for (const auto& t : build_param_layout(m)) values += t.is_norm() ? static_cast<uint64_t>(t.numel) : 0;
  }
  return values * per_value / p;
}

void sum_norm_grads(Model& model, comm::Communicator& tp) {
  std::vector<ElementRange> norms;  // the norm parameters, in buffer order (the same on every rank)
  for (const auto& t : model.param_layout()) {
    if (t.is_norm()) norms.push_back({t.offset, t.offset + t.numel});
  }
  const bool canonical = model.mode() == Mode::kCanonical;
  sum_over_group(canonical ? GradSink{nullptr, &model.exact_grads(), 0} : GradSink{model.grads(), nullptr, 0}, norms,
                 tp);
}

void sum_over_group(GradSink grads, std::span<const ElementRange> ranges, comm::Communicator& group) {
  // Elements j = 0 .. n-1 of the ranges, in order, and the storage index of each.
  std::vector<size_t> idx;
  for (const ElementRange& r : ranges) {
    for (int64_t i = r.first; i < r.end; ++i) idx.push_back(static_cast<size_t>(i));
  }
  const auto n = static_cast<int64_t>(idx.size());
  const int p = group.size(), me = group.rank();
  if (grads.exact == nullptr) {
    std::vector<float> sum(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) sum[j] = grads.f32[idx[j]];
    CommTpGroup(group).all_reduce_sum(sum.data(), n);
    for (size_t j = 0; j < idx.size(); ++j) grads.f32[idx[j]] = sum[j];
    return;
  }
  // Every rank's exact sums: the doubles (0 where spilled) and a record per spilled element
  // (index, flags, digits), then the others' added to mine — exact in any order.
  ExactAccumulator& acc = *grads.exact;
  constexpr int kWords = 2 + SuperAccumulator::kDigits;
  std::vector<double> mine(idx.size());
  std::vector<int64_t> records;
  for (size_t j = 0; j < idx.size(); ++j) {
    if (!acc.spilled(idx[j])) {
      mine[j] = acc.partial_sums()[idx[j]];
      continue;
    }
    const SuperAccumulator& s = acc.spill(idx[j]);
    records.push_back(static_cast<int64_t>(j));
    records.push_back(s.flags());
    records.insert(records.end(), s.digits(), s.digits() + SuperAccumulator::kDigits);
  }
  std::vector<double> all(idx.size() * static_cast<size_t>(p));
  group.all_gather(mine.data(), all.data(), n, DType::kF64);
  const std::vector<int64_t> counts = group.all_gather(static_cast<int64_t>(records.size()));
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t q = 1; q < counts.size(); ++q) displs[q] = displs[q - 1] + counts[q - 1];
  std::vector<int64_t> theirs(static_cast<size_t>(displs.back() + counts.back()));
  group.all_gatherv(records.data(), theirs.data(), counts, displs, DType::kI64);
  for (int q = 0; q < p; ++q) {
    if (q == me) continue;
    const double* d = all.data() + static_cast<size_t>(q) * idx.size();
    for (size_t j = 0; j < idx.size(); ++j) {
      if (d[j] != 0.0) acc.add(idx[j], d[j]);
    }
    const auto qs = static_cast<size_t>(q);
    for (int64_t r = displs[qs]; r < displs[qs] + counts[qs]; r += kWords) {
      const int64_t* rec = theirs.data() + r;
      acc.add(idx[static_cast<size_t>(rec[0])], SuperAccumulator::from_digits(rec + 2, static_cast<uint8_t>(rec[1])));
    }
  }
}

void CommTpGroup::all_reduce_exact(const ExactAccumulator& acc, float* x) {
  const ShardPlan plan = even_plan(static_cast<int64_t>(acc.size()), comm_.size());
  shard_.resize(static_cast<size_t>(plan.size(comm_.rank())));
  exact_reduce_scatter(acc, plan, comm_, shard_.data());
  comm_.all_gatherv(shard_.data(), x, plan.sizes(), plan.firsts(), DType::kF32);
}

void CommTpGroup::all_reduce_sum(float* x, int64_t n) {
  const ShardPlan plan = even_plan(n, comm_.size());
  shard_.resize(static_cast<size_t>(plan.size(comm_.rank())));
  comm_.reduce_scatter(x, shard_.data(), plan.sizes(), DType::kF32, comm::ReduceOp::kSum);
  comm_.all_gatherv(shard_.data(), x, plan.sizes(), plan.firsts(), DType::kF32);
}

void CommTpGroup::all_reduce_max(float* x, int64_t n) {
  comm_.all_reduce(x, x, n, DType::kF32, comm::ReduceOp::kMax);
}

void CommTpGroup::all_gather(const float* local, float* full, int64_t n) {
  comm_.all_gather(local, full, n, DType::kF32);
}

void CommTpGroup::reduce_scatter_exact(const ExactAccumulator& acc, float* local) {
  exact_reduce_scatter(acc, even_plan(static_cast<int64_t>(acc.size()), comm_.size()), comm_, local);
}

void CommTpGroup::reduce_scatter_sum(const float* full, float* local, int64_t n) {
  const std::vector<int64_t> counts(static_cast<size_t>(comm_.size()), n);
  comm_.reduce_scatter(full, local, counts, DType::kF32, comm::ReduceOp::kSum);
}

namespace {

// The global layout's tensors that `local` holds (a contiguous run of them: all, or a pipeline
// stage's; of ep rank ep.rank's tensors), with offsets counted from the run's first; and where the
// run starts in the list.
std::pair<std::vector<ParamTensor>, size_t> global_run(const ModelConfig& model, const std::vector<ParamTensor>& local,
                                                       EpCoord ep) {
  const std::vector<ParamTensor> all = hold_experts(build_param_layout(model), ep);
  size_t first = 0;
  while (first < all.size() && all[first].name != local.front().name) ++first;
  LS_CHECK(first + local.size() <= all.size(), "tensors from ", local.front().name, " are not the model's");
  std::vector<ParamTensor> run(all.begin() + static_cast<std::ptrdiff_t>(first),
                               all.begin() + static_cast<std::ptrdiff_t>(first + local.size()));
  const int64_t base = run.front().offset;
  for (ParamTensor& t : run) t.offset -= base;
  return {std::move(run), first};
}

}  // namespace

std::vector<float> gather_global(const ModelConfig& model, const std::vector<ParamTensor>& local,
                                 const float* local_data, comm::Communicator& tp, EpCoord ep) {
  const auto [global, first] = global_run(model, local, ep);
  const int p = tp.size();
  const int64_t n = local.back().offset + local.back().numel;  // the same on every tp rank
  std::vector<float> all(static_cast<size_t>(n) * static_cast<size_t>(p));
  tp.all_gather(local_data, all.data(), n, DType::kF32);
  std::vector<float> out(static_cast<size_t>(global.back().offset + global.back().numel));
  for (int q = 0; q < p; ++q) {
    const std::vector<ParamTensor> theirs = hold_experts(build_param_layout(model, {p, q}), ep);
    const float* data = all.data() + static_cast<size_t>(q) * static_cast<size_t>(n);
    const int64_t base = theirs[first].offset;
    for (size_t t = 0; t < global.size(); ++t) {
      const ParamTensor& g = global[t];
      const ParamTensor& s = theirs[first + t];
      for (int64_t i = 0; i < s.numel; ++i) {
        out[static_cast<size_t>(g.offset + s.global_index(i))] = data[s.offset - base + i];
      }
    }
  }
  return out;
}

void take_local(const ModelConfig& model, const std::vector<ParamTensor>& local, const float* global_data,
                float* local_data) {
  const std::vector<ParamTensor> global = global_run(model, local, {}).first;
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
