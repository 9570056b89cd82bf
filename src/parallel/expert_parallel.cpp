// Expert parallelism: its checks, exchange and plan (see expert_parallel.hpp).
#include "src/parallel/expert_parallel.hpp"

#include <algorithm>
#include <map>

#include "src/core/check.hpp"

namespace lockstep::parallel {

void check_ep_layout(const ModelConfig& model, int64_t ep, const EpRun& run, const std::string& source) {
  if (ep == 1) return;
  const std::string head = source + ": [parallel] ep = " + std::to_string(ep);
  LS_REQUIRE(model.moe_experts > 0, head, " splits the routed experts of MoE layers, and this model has none ",
             "([model] moe_experts = 0)");
  LS_REQUIRE(model.moe_experts % ep == 0, head, " must divide [model] moe_experts (", model.moe_experts,
             "): every ep rank holds moe_experts / ep experts of each MoE layer");
  // An expert's GEMM reads every peer's rows at once: a current-scaling amax would span other
  // ranks' micro-batches, and the scale would depend on the layout.
  const bool current = run.precision.linears == Precision::kFp8 && run.precision.fp8.scaling == Fp8Scaling::kCurrent;
  LS_REQUIRE(!current, head, " does not run with [fp8] recipe = \"current\" (an expert's ",
             "scale would be the amax of rows from several ranks' micro-batches, so the bits would depend on the ",
             "layout); use \"delayed\", \"mxfp8\" or \"blockwise\"");
  LS_REQUIRE(!run.buddy, head, " does not run with [verify] buddy_every yet (a buddy replays another data rank's ",
             "batch; expert parallelism spreads a batch's tokens over the ep group)");
}

const char* data_ranks_name(int64_t ep) { return ep > 1 ? "[parallel] dp x ep" : "[parallel] dp"; }

uint64_t ep_min_bytes(const ModelConfig& model, int64_t ep, int64_t tokens, int64_t moe_layers, int64_t replicated) {
  if (ep == 1) return 0;
  const auto rows = static_cast<uint64_t>(tokens * model.moe_top_k);
  const auto p = static_cast<uint64_t>(ep);
  const uint64_t exchanges = static_cast<uint64_t>(moe_layers) * 4 * 4 * static_cast<uint64_t>(model.d_model) * rows;
  return exchanges * (p - 1) / p + 8 * static_cast<uint64_t>(replicated) * (p - 1) / p;
}

void CommExpertExchange::all_to_all(const int64_t* send, int64_t* recv, int64_t n) {
  comm_.all_to_all(send, recv, n, DType::kI64);
}

void CommExpertExchange::rows(const void* send, const int64_t* send_rows, void* recv, const int64_t* recv_rows,
                              int64_t width, DType t) {
  const auto p = static_cast<size_t>(comm_.size());
  counts_.assign(4 * p, 0);
  int64_t* sc = counts_.data();
  int64_t* sd = sc + p;
  int64_t* rc = sd + p;
  int64_t* rd = rc + p;
  for (size_t q = 0; q < p; ++q) {
    sc[q] = send_rows[q] * width;
    rc[q] = recv_rows[q] * width;
    if (q > 0) {
      sd[q] = sd[q - 1] + sc[q - 1];
      rd[q] = rd[q - 1] + rc[q - 1];
    }
  }
  comm_.all_to_allv(send, {sc, p}, {sd, p}, recv, {rc, p}, {rd, p}, t);
}

void CommExpertExchange::all_to_all_rows(const float* send, const int64_t* send_rows, float* recv,
                                         const int64_t* recv_rows, int64_t width) {
  rows(send, send_rows, recv, recv_rows, width, DType::kF32);
}

void CommExpertExchange::all_to_all_rows(const int64_t* send, const int64_t* send_rows, int64_t* recv,
                                         const int64_t* recv_rows, int64_t width) {
  rows(send, send_rows, recv, recv_rows, width, DType::kI64);
}

std::vector<ParamTensor> ExpertParallelPlan::param_layout(const ModelDesc& desc) const {
  return hold_experts(inner_.param_layout(desc), {exchange_.size(), exchange_.rank()});
}

ExpertShard ExpertParallelPlan::experts(const LayerDesc& layer) const {
  const int64_t held = layer.experts / exchange_.size();
  return {exchange_.rank() * held, held, &exchange_};
}

std::vector<float> gather_experts(const std::vector<ParamTensor>& whole, const std::vector<float>& mine,
                                  comm::Communicator& ep) {
  const int p = ep.size();
  const auto n = static_cast<int64_t>(mine.size());  // the same on every ep rank
  std::vector<float> all(static_cast<size_t>(n) * static_cast<size_t>(p));
  ep.all_gather(mine.data(), all.data(), n, DType::kF32);
  std::map<std::string, const ParamTensor*> where;
  for (const ParamTensor& t : whole) where[t.name] = &t;
  std::vector<float> out(static_cast<size_t>(whole.back().offset + whole.back().numel));
  for (int q = 0; q < p; ++q) {
    const float* data = all.data() + static_cast<size_t>(q) * static_cast<size_t>(n);
    for (const ParamTensor& t : hold_experts(whole, {p, q})) {
      if (q > 0 && !t.is_expert()) continue;  // replicated: ep rank 0's
      std::copy_n(data + t.offset, t.numel, out.begin() + where.at(t.name)->offset);
    }
  }
  return out;
}

}  // namespace lockstep::parallel
