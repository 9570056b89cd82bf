// Expert parallelism over a mesh's ep group: the routed experts of every MoE layer split over the
// ep ranks (rank r holds experts [r·E/ep, (r+1)·E/ep)), each rank training on its own part of the
// batch as a data-parallel rank does. A MoE layer sends the rows of its tokens routed to another
// rank's experts there and gets their outputs back (all-to-all-v, ExpertExchange); the backward
// does the same with the gradients (src/model/layers/moe.cpp).
//
// Groups: the data ranks are dp × ep (every rank with the same tp, pp and cp coordinates, in dp,
// then ep order: data rank = dp·ep + ep rank), one part of the batch each. Every tensor that is not
// a routed expert's is replicated over them; an expert's over the dp ranks only. DataParallel
// therefore runs over dp, each gradient bucket's replicated tensors summed over the ep ranks first
// (data_parallel.hpp, DpOptions::expert); the gradient norm counts those on ep rank 0 only.
//
// Canonical bits: an expert sums its rows' weight gradients chunk by chunk of the step's tokens
// whichever rank they came from (each row carries its global token index), and every gradient is
// an exact sum rounded once, so the model hash is the one-process hash for every ep.
//
// Cost per MoE layer and micro-batch, for R = tokens·top_k rows of C floats a rank routes: forward,
// dispatch and return 2 · 4·C·R·(ep−1)/ep bytes sent on average (balanced routing), plus the counts
// (8·E/ep per peer) and the rows' token indices (8·R·(ep−1)/ep); backward the same rows again. The
// replicated tensors' gradients (n of them) are summed over ep before the dp reduction, exactly:
// an all-gather of their exact sums (8·n·(ep−1) bytes per rank; canonical), or an fp32 sum
// (8·n·(ep−1)/ep; fast).
//
// Not here: the routing (src/model/moe_routing.hpp), the dp reduction (data_parallel.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/model/config.hpp"
#include "src/model/modules.hpp"
#include "src/model/precision.hpp"

namespace lockstep::parallel {

// What else a run with expert parallelism uses.
struct EpRun {
  PrecisionRecipe precision;
  bool buddy = false;
};
// ConfigError naming `source` and the field where ep cannot run: ep > 1 needs MoE layers whose
// routed experts ep divides, does not run with fp8 current scaling, and not yet with buddy replays.
void check_ep_layout(const ModelConfig& model, int64_t ep, const EpRun& run, const std::string& source);
// How messages name the data ranks the batch splits over: "[parallel] dp", or with expert
// parallelism "[parallel] dp x ep" (plan_dp_batch's `ranks`).
const char* data_ranks_name(int64_t ep);

class CommExpertExchange final : public ExpertExchange {
 public:
  explicit CommExpertExchange(comm::Communicator& comm) : comm_(comm) {}
  int64_t size() const override { return comm_.size(); }
  int64_t rank() const override { return comm_.rank(); }
  void all_to_all(const int64_t* send, int64_t* recv, int64_t n) override;
  void all_to_all_rows(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                       int64_t width) override;
  void all_to_all_rows(const int64_t* send, const int64_t* send_rows, int64_t* recv, const int64_t* recv_rows,
                       int64_t width) override;

 private:
  void rows(const void* send, const int64_t* send_rows, void* recv, const int64_t* recv_rows, int64_t width, DType t);
  comm::Communicator& comm_;
  std::vector<int64_t> counts_;  // send counts, displacements, receive counts, displacements
};

// `inner` (one device, or a tensor-parallel plan) with this rank's routed experts only.
class ExpertParallelPlan final : public ForwardingPlan {
 public:
  // Both must outlive the plan.
  ExpertParallelPlan(const ModelPlan& inner, ExpertExchange& exchange) : ForwardingPlan(inner), exchange_(exchange) {}

  std::vector<ParamTensor> param_layout(const ModelDesc& desc) const override;
  ExpertShard experts(const LayerDesc& layer) const override;

 private:
  ExpertExchange& exchange_;
};

// The least a rank must send per step for expert parallelism, for `tokens` tokens on the rank,
// `moe_layers` MoE layers in its chunks and `replicated` parameters it holds that are not experts':
// per MoE layer, its rows to the experts'
// ranks and their outputs back, forward and backward (4 · 4·C·tokens·top_k·(ep−1)/ep bytes, with
// a balanced router and no drops), and the replicated gradients summed over ep as an fp32 ring
// all-reduce would (8·replicated·(ep−1)/ep). 0 for ep = 1.
uint64_t ep_min_bytes(const ModelConfig& model, int64_t ep, int64_t tokens, int64_t moe_layers, int64_t replicated);

// The buffer laid out as `whole` (whole tensors, offsets packed: the model's, or a pipeline rank's
// chunks') from every ep rank's `mine`, laid out as hold_experts(whole, that rank). Collective over
// ep; every rank gets the whole buffer.
std::vector<float> gather_experts(const std::vector<ParamTensor>& whole, const std::vector<float>& mine,
                                  comm::Communicator& ep);

}  // namespace lockstep::parallel
