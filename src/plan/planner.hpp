// The layout planner (`lockstep plan`, docs/planner.md): the cost model of cost_model.hpp over one
// request and cluster, with what repeats between layouts computed once (the stages of each
// pipeline depth, the timelines of each schedule shape), and the search over the layouts the
// trainer runs.
//
// Search: every dp × tp × pp × cp × ep of the cluster's GPUs with tp a power of two within a node,
// pp any divisor that leaves each stage a layer, cp a power of two, ep a divisor of a MoE model's
// routed experts (1 for a dense one); micro-batches of 1, 2, 4, 8 or 16 sequences that divide
// a replica's share of the batch; zero 0 to 3; sequence parallelism off and on (tp > 1); no,
// selective or full recomputation; 1F1B, zero-bubble or interleaved with two stages a rank across
// stages (kSearchedSchedules). What the trainer
// refuses — zero-bubble with recompute or fp8, ZeRO-3 with pipelining or fp8, and cp with
// pipelining, fp8 or a sequence that 2·cp blocks of 64-position chunks do not tile — is a
// problem: --explain names it. A layout the trainer refuses, or that does not fit in the GPU's HBM, is rejected with the
// reason; the rest are ranked by predicted step time, then memory, then their text (a
// deterministic order).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "src/parallel/pipeline_schedule.hpp"
#include "src/plan/compute_profile.hpp"
#include "src/plan/cost_model.hpp"

namespace lockstep::plan {

// Why a layout is out: a short kind (for counting) and the full sentence.
struct Problem {
  std::string kind, text;
  bool empty() const { return text.empty(); }
};

struct SearchResult {
  std::vector<Prediction> ranked;  // layouts that fit, best first
  // Per kind of problem: how many layouts, and the first one's layout and sentence.
  struct Rejection {
    int64_t count = 0;
    Layout example;
    std::string text;
  };
  std::map<std::string, Rejection> rejected;
  int64_t considered = 0;
  // The layout that needed the least memory, when none fits (its prediction).
  bool any_predicted = false;
  Prediction least_memory;
};

struct CollectiveBench;

class Planner {
 public:
  // profile: a rank's passes measured on this machine (the local cluster), which then replace the
  // cluster's GEMM rate and add the optimizer's update; it must outlive the planner.
  Planner(PlanRequest request, Cluster cluster, const ComputeProfile* profile = nullptr);

  // A local cluster's links measured again (set_measured_links): the predictions after it price
  // communication at the machine's state of that measurement.
  void set_measured_links(const CollectiveBench& collectives);

  Problem problem(const Layout& layout);
  // The prediction of a layout without a problem.
  Prediction predict(const Layout& layout);
  // A problem or, where none, whether it fits: kind "memory".
  Problem fits(const Prediction& p) const;
  SearchResult search();

 private:
  struct RankCost;
  std::vector<RankCost> rank_costs(const Layout& layout);
  const std::vector<std::vector<size_t>>& rank_layers(int64_t pp, int64_t chunks);
  // What a prediction reads of a pipeline's timeline.
  struct PipelineTime {
    double makespan = 0;
    std::vector<int64_t> chunk_slots;  // parallel::Timeline's
  };
  PipelineTime timeline(const Layout& layout, int64_t micro, const std::vector<parallel::PassCosts>& costs,
                        parallel::TiedEmbedding tied);
  // make_schedule's error for a layout's schedule with `micro` micro-batches ("" where it fits),
  // once per shape.
  const std::string& schedule_problem(const Layout& layout, int64_t micro);

  // Seconds of a micro-batch's forward and backward through one rank's layers, and the
  // recomputed forwards its backward runs first.
  // The zero-bubble schedule's split backward: its two passes' shares of `backward` (measured, or
  // on a declared cluster even; measured, their sum is a little over 1).
  struct Passes {
    double forward = 0, backward = 0, recompute = 0;
    double input_share = 0.5, weight_share = 0.5;
    double streaming = 0;  // of the three: the kernels other than GEMMs (declared clusters)
  };
  Passes passes(const Layout& layout, const RankCost& r);
  // Per token of the whole model (not split over tp), the forward FLOPs `recompute` runs again
  // (rank_costs' rule), computed once.
  double model_recompute_flops(Recompute recompute);
  // A rank's tokens of a micro-batch: its positions (T / cp) of each sequence.
  double rank_tokens(const Layout& layout) const;
  // The buffers of the data-parallel gradient reduction on a rank whose gradients take `fp32`
  // bytes, over `shards` ZeRO shards (`sharded`: ZeRO 2 and 3).
  double dp_reduction_bytes(double fp32, double shards, bool sharded) const;
  // The buffers of canonical mode's exact tensor-parallel reductions of `tokens` tokens' stream.
  double tp_exact_reduction_bytes(const Layout& layout, double tokens) const;
  // Bytes an activation takes as the trainer keeps and sends it: 2 in a bf16 or fp8 run (their
  // linears read and write bf16), 4 in fp32 or where the cluster keeps low precision in fp32
  // containers (Cluster::low_precision_in_fp32).
  double activation_bytes() const;
  // Bytes a matrix parameter's low-precision copies take beside its fp32 master: in bf16 its bf16
  // copy where the cluster's linears read one (Cluster::bf16_weight_copy), in fp8 that copy always
  // and its rowwise and columnwise fp8 ones.
  double weight_copy_bytes() const;
  // Bytes of the GEMMs' packing scratch a rank of `r` grows beyond what the reserved memory holds,
  // at `tokens` a micro-batch (0 where the cluster's GEMMs keep none).
  double packed_operands(const RankCost& r, double tokens) const;
  // An all-reduce of `bytes` over n ranks on `link` (the cluster's measured one where it has it);
  // a ring's reduce-scatter takes half of it.
  double all_reduce(double bytes, int64_t n, const Link& link) const;
  // An all-gather of `bytes` (the gathered buffer) over n ranks on `link`, likewise.
  double all_gather(double bytes, int64_t n, const Link& link) const;
  // An all-reduce of the tensor-parallel activations or of context parallelism's key and value
  // gradients (canonical mode's exact one).
  double reduction_time(double fp32_bytes, int64_t n, const Link& link) const;
  // The gradients' all-reduce over the replicas, and ZeRO-2's reduce-scatter of them, as the
  // request's mode and reduction run them (PlanRequest::exact_reduce); shard_bytes: a rank's shard
  // of the gradient, which a smaller bucket lies inside.
  double gradient_reduction_time(double fp32_bytes, int64_t n, const Link& link, double shard_bytes) const;
  double scatter_time(double fp32_bytes, int64_t n, const Link& link, double shard_bytes) const;
  // ZeRO-3: the step's per-layer parameter all-gathers over n ranks (layer_bytes: each layer's
  // gather) beyond the `busy` seconds of passes that hide them.
  double gathers_exposed(const std::vector<double>& layer_bytes, int64_t micro, double busy, const Link& link,
                         int64_t n) const;

  PlanRequest request_;
  Cluster cluster_;
  const ComputeProfile* profile_;
  double model_forward_flops_ = 0;  // per token, every layer's
  // Per token, the forwards every layer runs again under each recomputation (rank_costs' rule).
  std::map<Recompute, double> model_recompute_flops_;
  double head_flops_ = 0;  // a tied head's product per token (declared with the embedding)
  std::map<std::pair<int64_t, int64_t>, std::vector<std::vector<size_t>>> layers_;
  // By schedule, pp, micro-batches and chunks (and every rank's pass costs). Tables run to pp × 3m
  // passes, so only the last one made is kept: the search predicts a shape's layouts in runs.
  using ScheduleShape = std::tuple<int, int64_t, int64_t, int64_t>;
  static ScheduleShape schedule_shape(const Layout& layout, int64_t micro) {
    return {static_cast<int>(layout.schedule), layout.pp, micro, layout.chunks};
  }
  std::map<ScheduleShape, std::string> schedule_problems_;
  std::optional<std::pair<ScheduleShape, parallel::PipelineSchedule>> last_table_;
  std::map<std::pair<ScheduleShape, std::vector<double>>, PipelineTime> timelines_;
};

}  // namespace lockstep::plan
