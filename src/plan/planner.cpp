#include "src/plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <utility>

#include "src/core/check.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/expert_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/plan/kernel_traffic.hpp"
#include "src/plan/local_cluster.hpp"
#include "src/train/pipeline.hpp"

namespace lockstep::plan {

// What one pipeline rank holds and does, per token of a micro-batch unless said otherwise.
struct Planner::RankCost {
  double forward_flops = 0;    // its layers' forward (a third of the trained FLOPs)
  double recompute_flops = 0;  // forwards run again before their backward
  // Bytes its kernels other than GEMMs move (kernel_traffic.hpp): forward, backward, and the
  // recomputed layers' forward again.
  Traffic traffic;
  double recompute_bytes = 0;
  int64_t forward_reduces = 0, backward_reduces = 0, recompute_reduces = 0;  // tp all-reduces a micro-batch
  double params = 0, matmul_params = 0;  // elements this GPU holds
  double replicated_params = 0;          // of them, those every ep rank holds (not a routed expert's)
  int64_t moe_layers = 0;                // expert parallelism exchanges rows in each
  // Context parallelism gathers k and v in each attention layer's forward, the recomputed ones'
  // again.
  int64_t attention_layers = 0, recomputed_attention = 0;
  // Elements each of its layers reads, in list order (a tied head: wte) — ZeRO-3 gathers these,
  // and the bytes of that gather (bf16 for the matrices of a bf16 run, as the trainer sends them).
  std::vector<double> layer_params, layer_gather_bytes;
  // The (input, output) features a token of each attention, MLP and head linear it runs: the
  // largest product's operands size the GEMMs' packing scratch (packed_operands). A MoE layer's
  // experts, each on a share of the tokens, are not among them.
  std::vector<std::pair<double, double>> linears;
  double kept_bytes = 0;     // activations a micro-batch keeps until its backward
  // A split backward's (zb) copies of the linears' output gradients, kept from Bi until W: fp32,
  // the stream's and the branch's of each attention and MLP sub-layer.
  double deferred_bytes = 0;
  // The recomputed layers' rebuilt activations: the layers of a kind rebuild theirs one at a time
  // in one set they share (layer.hpp's SlotActivations), each kind in its own.
  double rebuilt_bytes = 0;
  // The backward's buffers, one micro-batch's: the scratch the layers share (the largest layer's
  // need, as attention.cpp and mlp.cpp size it) and the stream's gradient between layers (two).
  double scratch_bytes = 0;
  // Context parallelism's buffers per position of a micro-batch's sequences (they hold every
  // position's): the attention ops' shared set, and one exact reduction's.
  double cp_held_bytes = 0, cp_reduce_bytes = 0;
  // The ring's recomputed attention products a token (context_parallel.hpp): forward and backward.
  double ring_forward_flops = 0, ring_backward_flops = 0;
};

namespace {

// The routed experts' FLOPs a token of MoE layer `l` (top_k of them, each 6 a weight).
double routed_flops_per_token(const LayerDesc& l) {
  double flops = 0;
  for (const ParamDecl& p : l.params) {
    if (p.matmul && p.expert >= 0) flops += 6.0 * static_cast<double>(param_numel(p)) * p.token_share;
  }
  return flops;
}

// The measured passes a rank of `layout` runs, with `recompute`.
PassShape pass_shape(const Layout& layout, Recompute recompute) {
  return {layout.tp, layout.sp, layout.micro_batch, recompute, layout.cp, layout.cp > 1 && layout.ring};
}

}  // namespace

Planner::Planner(PlanRequest request, Cluster cluster, const ComputeProfile* profile)
    : request_(std::move(request)), cluster_(std::move(cluster)), profile_(profile) {
  const LayerDesc& last = request_.model.layers.back();
  if (last.kind == LayerKind::kHead && last.tied) {
    head_flops_ = 6.0 * static_cast<double>(last.dims.V) * static_cast<double>(last.dims.C);
  }
  for (const LayerDesc& l : request_.model.layers) model_forward_flops_ += layer_flops_per_token(l) / 3;
}

void Planner::set_measured_links(const CollectiveBench& collectives) {
  plan::set_measured_links(cluster_, collectives);
}

Planner::Passes Planner::passes(const Layout& layout, const RankCost& r) {
  if (profile_ != nullptr) {
    // The measured passes of the whole model as one of the layout's ranks computes them (a cp
    // rank: its blocks of each sequence, with the ring's recomputed products where it runs the
    // ring), the share of these layers by their FLOPs; the recomputation, what it adds to the
    // backward.
    const PassTimes& plain = profile_->at(pass_shape(layout, Recompute::kNone));
    const PassTimes& with = profile_->at(pass_shape(layout, layout.recompute));
    const double share = r.forward_flops / model_forward_flops_;
    // The recomputation's share is of the recomputed layers': a pipeline's last stage holds the
    // head, a large share of the FLOPs, which no recomputation runs again.
    const double recompute_share = r.recompute_flops > 0 ? r.recompute_flops / model_recompute_flops(layout.recompute) : 0;
    return {plain.forward * share, plain.backward * share, (with.backward - plain.backward) * recompute_share,
            plain.backward_input / plain.backward, plain.backward_weight / plain.backward};
  }
  const double tokens = rank_tokens(layout);
  const double per_flop = tokens / (cluster_.gemm_flops(request_.precision) * static_cast<double>(layout.tp));
  const double per_byte = cluster_.stream_bandwidth > 0 ? tokens / cluster_.stream_bandwidth : 0;
  Passes p{(r.forward_flops + r.ring_forward_flops) * per_flop + r.traffic.forward * per_byte,
           (2 * r.forward_flops + r.ring_backward_flops) * per_flop + r.traffic.backward * per_byte,
           r.recompute_flops * per_flop + r.recompute_bytes * per_byte};
  p.streaming = (r.traffic.forward + r.traffic.backward + r.recompute_bytes) * per_byte;
  return p;
}

double Planner::model_recompute_flops(Recompute recompute) {
  auto it = model_recompute_flops_.find(recompute);
  if (it == model_recompute_flops_.end()) {
    it = model_recompute_flops_.emplace(recompute, rank_costs({.recompute = recompute}).front().recompute_flops).first;
  }
  return it->second;
}

double Planner::activation_bytes() const {
  return request_.precision == Precision::kF32 || cluster_.low_precision_in_fp32 ? 4 : 2;
}

double Planner::weight_copy_bytes() const {
  const auto stored = [&](double bytes) { return cluster_.low_precision_in_fp32 ? 4 : bytes; };
  switch (request_.precision) {
    case Precision::kF32:
      return 0;
    case Precision::kBf16:
      return cluster_.bf16_weight_copy ? stored(2) : 0;
    case Precision::kFp8:
      return stored(2) + 2 * stored(1);
  }
  return 0;
}

double Planner::packed_operands(const RankCost& r, double tokens) const {
  if (!cluster_.keeps_packed_operands) return 0;
  // A linear of n tokens runs three products, each packing its two operands whole: the forward
  // (n x in)(in x out), the input gradient (n x out)(out x in), the weight gradient
  // (out x n)(n x in). A bf16 run's operands are packed in pairs, two bytes an element.
  double elements = 0;
  for (const auto& [in, out] : r.linears) {
    elements = std::max({elements, (tokens + out) * in, (tokens + in) * out, (in + out) * tokens});
  }
  const double bytes = request_.precision == Precision::kF32 ? 4 : 2;
  return elements * bytes;
}

double Planner::dp_reduction_bytes(double fp32, double shards, bool sharded) const {
  // What the reduction of one bucket keeps (data_parallel.cpp, exact_reduce.cpp): canonical mode's
  // exact one receives every rank's doubles of this rank's part (8 bytes an element of the bucket)
  // and sums them exactly (13 bytes an element of the part); fast mode's receives every rank's fp32
  // values of the part (4 bytes an element of the bucket). Below ZeRO 2 the reduced shard is kept
  // apart, then gathered into the gradients; from ZeRO 2 each part other than exact sums lands in
  // the staged shard through a buffer of its own, and canonical mode reducing in fp32 rounds the
  // bucket's exact sums into one first (4 bytes an element of the bucket).
  const double elements = std::min(fp32, request_.bucket_bytes) / 4;
  const bool canonical = request_.mode == Mode::kCanonical, exact_sums = request_.exact_reduce && canonical;
  const double received = exact_sums ? elements * 8 + elements / shards * 13 : request_.exact_reduce ? elements * 4 : 0;
  const double kept = !sharded     ? fp32 / shards
                      : exact_sums ? 0
                                   : elements / shards * 4 + (canonical ? elements * 4 : 0);
  return received + kept;
}

double Planner::tp_exact_reduction_bytes(const Layout& layout, double tokens) const {
  if (layout.tp == 1 || request_.mode != Mode::kCanonical) return 0;
  // Canonical mode sums a split reduction of a micro-batch's stream (n = tokens x d_model: the
  // row-parallel outputs, the column-parallel input gradients) exactly (tp_plan.cpp,
  // tensor_parallel.cpp): the ranks' exact partial sums (a double and a flag an element), every
  // rank's doubles of this rank's part received, their exact sums, and without sequence
  // parallelism the rounded part before its all-gather; each kept at the largest size.
  const double n = tokens * static_cast<double>(request_.model.config.d_model), t = static_cast<double>(layout.tp);
  return n * (9 + 8 + 9 / t + (layout.sp ? 0 : 4 / t));
}

double Planner::rank_tokens(const Layout& layout) const {
  return static_cast<double>(layout.micro_batch * request_.model.config.seq_len) / static_cast<double>(layout.cp);
}

double Planner::all_reduce(double bytes, int64_t n, const Link& link) const {
  return all_reduce_time(bytes, n, link, cluster_.measured);
}

double Planner::all_gather(double bytes, int64_t n, const Link& link) const {
  return all_gather_time(bytes, n, link, cluster_.measured);
}

double Planner::reduction_time(double fp32_bytes, int64_t n, const Link& link) const {
  if (request_.mode == Mode::kCanonical) return exact_all_reduce_time(fp32_bytes, n, link, cluster_.measured);
  return all_reduce(fp32_bytes, n, link);
}

double Planner::gathers_exposed(const std::vector<double>& layer_bytes, int64_t micro, double busy, const Link& link,
                                int64_t n) const {
  // Each micro-batch's forward gathers every layer but the first (the last backward left it in
  // its window), its backward every layer but the last; the step's first forward its first too.
  const auto gather = [&](double bytes) { return layer_gather_time(bytes, n, link, cluster_.measured); };
  double every = 0;
  for (double bytes : layer_bytes) every += gather(bytes);
  const double first = gather(layer_bytes.front());
  const double total = static_cast<double>(micro) * (2 * every - first - gather(layer_bytes.back())) + first;
  // The worker gathers the next layer while the passes compute: what the passes cannot hide, and
  // at least the first layer's gather, which nothing precedes — all of it where the worker has no
  // core of its own (its polling then slows the passes as much as it would have waited).
  return cluster_.comm_beside_compute ? std::max(total - busy, first) : total;
}

double Planner::gradient_reduction_time(double fp32_bytes, int64_t n, const Link& link, double shard_bytes) const {
  if (!request_.exact_reduce) return all_reduce(fp32_bytes, n, link);
  if (request_.mode == Mode::kCanonical) return exact_all_reduce_time(fp32_bytes, n, link, cluster_.measured);
  return scatter_time(fp32_bytes, n, link, shard_bytes) + all_gather(fp32_bytes, n, link);
}

double Planner::scatter_time(double fp32_bytes, int64_t n, const Link& link, double shard_bytes) const {
  if (!request_.exact_reduce) return all_reduce(fp32_bytes, n, link) / 2;
  const bool one_owner = fp32_bytes <= shard_bytes;
  if (request_.mode == Mode::kCanonical) {
    return exact_reduce_scatter_time(fp32_bytes, n, link, cluster_.measured, one_owner);
  }
  return exact_fp32_reduce_scatter_time(fp32_bytes, n, link, cluster_.measured, one_owner);
}

const std::vector<std::vector<size_t>>& Planner::rank_layers(int64_t pp, int64_t chunks) {
  auto it = layers_.find({pp, chunks});
  if (it != layers_.end()) return it->second;
  // Throws (nothing cached) for more stages than layers.
  const std::vector<StageLayers> stages = plan_stages(request_.model, pp * chunks, "", request_.source);
  std::vector<std::vector<size_t>> held(static_cast<size_t>(pp));
  for (size_t s = 0; s < stages.size(); ++s) {
    for (size_t l = stages[s].first; l < stages[s].end; ++l) held[s % static_cast<size_t>(pp)].push_back(l);
  }
  return layers_.emplace(std::make_pair(pp, chunks), std::move(held)).first->second;
}

std::vector<Planner::RankCost> Planner::rank_costs(const Layout& layout) {
  const auto t = static_cast<double>(layout.tp);
  const double stream = layout.sp ? 1 / t : 1;  // the residual stream's share of a token
  // The busiest expert-parallel rank's routed rows over a rank's mean share: without ep every rank
  // runs its own tokens' choices through every expert.
  const double routed_load = layout.ep > 1 ? request_.moe_load : 1;
  const double ab = activation_bytes();
  std::vector<RankCost> ranks;
  for (const std::vector<size_t>& held : rank_layers(layout.pp, layout.chunks)) {
    RankCost r;
    std::map<LayerKind, double> rebuilt;  // the largest of each recomputed kind
    for (size_t i : held) {
      const LayerDesc& l = request_.model.layers[i];
      const LayerDims& m = l.dims;
      const auto C = static_cast<double>(m.C), T = static_cast<double>(m.T);
      double flops = layer_flops_per_token(l);
      if (l.kind == LayerKind::kEmbedding) flops -= head_flops_;
      if (l.kind == LayerKind::kHead) flops += head_flops_;
      if (l.kind == LayerKind::kMoe) flops += (routed_load - 1) * routed_flops_per_token(l);
      r.forward_flops += flops / 3;
      const double matrix_bytes = request_.precision == Precision::kF32 ? 4 : 2;
      double reads = l.kind == LayerKind::kHead && l.tied ? static_cast<double>(l.dims.V * l.dims.C) / t : 0;
      double gather_bytes = reads * matrix_bytes;
      for (const ParamDecl& p : l.params) {
        const auto whole = static_cast<double>(param_numel(p));
        // Split by tp; a routed expert's held by one ep rank of ep.
        const double n = (p.split_dim >= 0 ? whole / t : whole) / (p.expert >= 0 ? static_cast<double>(layout.ep) : 1);
        r.params += n;
        if (p.expert < 0) r.replicated_params += n;
        reads += n;
        gather_bytes += n * (p.matmul ? matrix_bytes : 4);
        if (p.matmul) r.matmul_params += n;
      }
      r.layer_params.push_back(reads);
      r.layer_gather_bytes.push_back(gather_bytes);
      double input = 0, inside = 0, scratch = 0;
      bool recomputed = false;
      const double qkv = static_cast<double>(m.qkv_width()) / t, heads_out = static_cast<double>(m.NH * m.HS) / t;
      const double probs = static_cast<double>(m.NH) / t * T;  // a token's attention probabilities
      const double fc_out = static_cast<double>(m.F) * (l.ffn == FfnKind::kSwiglu ? 2 : 1) / t;
      switch (l.kind) {
        case LayerKind::kEmbedding:
          ++r.forward_reduces;
          r.kept_bytes += C * stream * ab;  // its output, the first residual stream
          break;
        case LayerKind::kAttention: {
          ++r.forward_reduces;
          ++r.backward_reduces;
          // The ring keeps each row's max and Z instead of its probabilities, and needs no
          // (tokens, T) workspace.
          const bool ring = layout.cp > 1 && layout.ring;
          input = C * stream;
          inside = C + qkv + (ring ? 2 * static_cast<double>(m.NH) / t : probs) + heads_out;  // the norm's output whole (gathered under sp)
          scratch = C * stream + qkv + heads_out + (ring ? 0 : probs);
          recomputed = layout.recompute != Recompute::kNone;
          r.deferred_bytes += 4 * (C * stream + qkv);
          r.linears.insert(r.linears.end(), {{C, qkv}, {heads_out, C}});
          ++r.attention_layers;
          if (recomputed) ++r.recomputed_attention;
          if (layout.cp == 1) break;
          // One set for every layer, fp32 (context_parallel.cpp's CpBuffers): the gathered q, k and v, the received k and v, the sent
          // ones (this rank's positions), the summed gradients of k and v; canonical: their exact
          // sums (a double and a flag) and this rank's shard, whose reduce-scatter receives every
          // rank's doubles of it and sums them exactly; fast: their fp32 partial sums.
          const double kv = static_cast<double>(2 * m.NKV * m.HS) / t, cp = static_cast<double>(layout.cp);
          const bool exact = request_.mode == Mode::kCanonical;
          if (exact) r.cp_reduce_bytes = std::max(r.cp_reduce_bytes, 8 * kv + 9 * kv / cp);
          if (!ring) {
            r.cp_held_bytes = std::max(r.cp_held_bytes, 4 * (qkv + 2 * kv + kv / cp) + (exact ? 9 * kv + 4 * kv / cp : 4 * kv));
            break;
          }
          // The ring's set: every rank's k and v, the keys' gradient sums and this rank's shard of
          // them, and its query rows' running sums (exact: a double and a flag each) and D.
          const double heads = heads_out / cp;
          r.cp_held_bytes = std::max(r.cp_held_bytes, 4 * kv + (exact ? 9 : 4) * kv + 4 * kv / cp +
                                                          (exact ? 9 : 4) * heads + 4 * static_cast<double>(m.NH) / t / cp);
          // Of attention's six products a token (activation_flops), the ring computes the scores
          // three times forward in canonical mode (twice in fast), and the scores and datt twice
          // backward.
          const double product = l.activation_flops / 6;
          r.ring_forward_flops += product * (exact ? 2 : 1);
          r.ring_backward_flops += product * 3;
          break;
        }
        case LayerKind::kMlp:
          ++r.forward_reduces;
          ++r.backward_reduces;
          input = C * stream;
          inside = C + fc_out + static_cast<double>(m.F) / t;
          scratch = C * stream + fc_out + static_cast<double>(m.F) / t;
          recomputed = layout.recompute == Recompute::kFull;
          r.deferred_bytes += 4 * (C * stream + fc_out);
          r.linears.insert(r.linears.end(), {{C, fc_out}, {static_cast<double>(m.F) / t, C}});
          break;
        case LayerKind::kFinalNorm:
          input = C * stream;
          inside = C;
          break;
        case LayerKind::kMoe: {
          // Every rank routes every token and its top_k choices' rows run through the experts,
          // split like an MLP: the rows' outputs (forward) and input gradients (backward) are
          // all-reduced whole, sequence parallelism or not (src/model/layers/moe.cpp), a top_k
          // times a token's stream; the shared experts' once more.
          // K: the choices' rows a token of this rank's, on the busiest ep rank.
          const double K = static_cast<double>(l.top_k) * routed_load, E = static_cast<double>(l.experts);
          const double shared_act = static_cast<double>(l.shared_F) / t;
          const double shared_fc = shared_act * (l.ffn == FfnKind::kSwiglu ? 2 : 1);
          const int64_t reduces = l.top_k + (l.shared_F > 0 ? 1 : 0);
          ++r.moe_layers;
          r.forward_reduces += reduces;
          r.backward_reduces += reduces;
          input = C * stream;
          // The norm's output whole, the router's logits and scores (fp32) and the gates, each
          // choice's row in and out and its hidden activations, the shared experts', and under
          // sequence parallelism the combined output of every token.
          // Expert parallelism keeps the received rows too, and stages each exchange (on average a
          // top_k rows a token each way).
          const double ep_rows = layout.ep > 1 ? K * C : 0;
          const double gates = static_cast<double>(l.top_k);
          inside = C + (2 * E + gates) * 4 / ab + K * (2 * C + fc_out + static_cast<double>(m.F) / t) +
                   (l.shared_F > 0 ? 2 * C + shared_fc + shared_act : 0) + (layout.sp ? C : 0) + ep_rows;
          scratch = C * stream + K * (2 * C + fc_out + static_cast<double>(m.F) / t) + (gates + E) * 4 / ab +
                    (l.shared_F > 0 ? C + shared_fc + shared_act : 0) + (layout.sp ? C : 0) +
                    (layout.ep > 1 ? K * (3 * C + fc_out + static_cast<double>(m.F) / t) : 0);
          recomputed = layout.recompute == Recompute::kFull;
          break;
        }
        case LayerKind::kHead:
          ++r.backward_reduces;
          // fp32 logits of this rank's vocabulary share, and (tied, on a stage of its own) the copy of wte
          r.kept_bytes += static_cast<double>(m.V) / t * 4;
          r.linears.push_back({C, static_cast<double>(m.V) / t});
          if (l.tied && layout.pp > 1) {
            r.params += static_cast<double>(m.V) * C / t;
            r.matmul_params += static_cast<double>(m.V) * C / t;
          }
          break;
      }
      r.scratch_bytes = std::max(r.scratch_bytes, (scratch + 2 * C * stream) * ab);
      const Traffic traffic = layer_traffic(l, layout.tp, layout.sp, request_.precision, routed_load);
      r.traffic.forward += traffic.forward;
      r.traffic.backward += traffic.backward;
      if (recomputed) {
        r.recompute_bytes += traffic.forward;
        r.recompute_flops += flops / 3;
        ++r.recompute_reduces;
        r.kept_bytes += input * ab;
        rebuilt[l.kind] = std::max(rebuilt[l.kind], (input + inside) * ab);
      } else {
        r.kept_bytes += (input + inside) * ab;
      }
    }
    for (const auto& [kind, bytes] : rebuilt) r.rebuilt_bytes += bytes;
    ranks.push_back(r);
  }
  return ranks;
}

Problem Planner::problem(const Layout& layout) {
  const ModelConfig& cfg = request_.model.config;
  const int64_t B = request_.global_batch, T = cfg.seq_len;
  if (layout.gpus() != cluster_.gpus()) {
    return {"gpus", str_cat("dp x tp x pp x cp x ep = ", layout.gpus(), " GPUs, the cluster has ", cluster_.gpus())};
  }
  try {
    PrecisionRecipe recipe;
    recipe.linears = request_.precision;
    parallel::check_ep_layout(cfg, layout.ep, {.precision = recipe}, request_.source);
  } catch (const ConfigError& e) {
    return {"ep", e.what()};
  }
  if (cluster_.peak(request_.precision) <= 0) {
    return {"precision", str_cat("the cluster's GPUs have no ", precision_name(request_.precision),
                                 " units ([peak_tflops] is 0 in ", cluster_.source, ")")};
  }
  if (layout.tp > cluster_.gpus_per_node) {
    return {"tp across nodes", str_cat("tp ", layout.tp, " spans nodes of ", cluster_.gpus_per_node, " GPUs")};
  }
  if (layout.zero > parallel::kMaxZeroStage) {
    return {"zero", str_cat("zero ", layout.zero, ": the trainer runs ZeRO stages 0 to ", parallel::kMaxZeroStage)};
  }
  if (layout.zero == 3) {
    const std::string why = parallel::zero3_layout_problem(layout.pp, request_.precision);
    if (!why.empty()) return {"zero", "zero 3 does not run with " + why};
  }
  if (layout.pp > 1 && layout.schedule == parallel::ScheduleKind::kZeroBubble) {
    const std::string why = zero_bubble_problem(layout.recompute, request_.precision);
    if (!why.empty()) return {"schedule", "the zero-bubble schedule does not run " + why};
  }
  // The trainer's own checks: context parallelism, the batch split, the schedule's shape, tensor
  // parallelism, stages.
  parallel::CpRun cp_run;
  cp_run.precision.linears = request_.precision;
  cp_run.pp = layout.pp;
  try {
    parallel::check_cp_layout(cfg, layout.cp, cp_run, request_.source);
  } catch (const ConfigError& e) {
    return {"cp", e.what()};
  }
  parallel::DpBatch split;
  try {
    split = parallel::plan_dp_batch(B, layout.micro_batch, T, layout.dp * layout.ep, request_.mode, request_.source,
                                    parallel::data_ranks_name(layout.ep));
  } catch (const ConfigError& e) {
    return {"batch split", e.what()};
  }
  // The trainer shrinks a micro-batch larger than a replica's share; here that is the smaller layout.
  if (split.local_micro != layout.micro_batch) {
    return {"batch split", str_cat("a replica's ", split.local_batch, " sequences are fewer than a micro-batch of ",
                                   layout.micro_batch)};
  }
  const int64_t micro = split.local_batch / split.local_micro;
  if (const std::string& why = schedule_problem(layout, micro); !why.empty()) return {"schedule", why};
  try {
    parallel::check_tp_layout(cfg, layout.tp, layout.sp, layout.micro_batch * T / layout.cp, request_.mode,
                              request_.source);
  } catch (const ConfigError& e) {
    return {"tp layout", e.what()};
  }
  try {
    rank_layers(layout.pp, layout.chunks);
  } catch (const ConfigError& e) {
    return {"stages", e.what()};
  }
  return {};
}

Planner::PipelineTime Planner::timeline(const Layout& layout, int64_t micro,
                                        const std::vector<parallel::PassCosts>& costs, parallel::TiedEmbedding tied) {
  std::vector<double> figures{tied.tied ? tied.send : -1};
  for (const parallel::PassCosts& c : costs) {
    figures.insert(figures.end(), {c.forward, c.backward_input, c.backward_weight, c.p2p});
  }
  const auto key = std::make_pair(schedule_shape(layout, micro), std::move(figures));
  auto it = timelines_.find(key);
  if (it != timelines_.end()) return it->second;
  if (!last_table_ || last_table_->first != key.first) {
    last_table_.emplace(key.first, parallel::make_schedule(layout.schedule, layout.pp, micro, layout.chunks, request_.source));
  }
  const parallel::Timeline t = parallel::simulate(last_table_->second, costs, tied);
  return timelines_.emplace(key, PipelineTime{t.makespan, t.chunk_slots}).first->second;
}

const std::string& Planner::schedule_problem(const Layout& layout, int64_t micro) {
  const ScheduleShape shape = schedule_shape(layout, micro);
  auto it = schedule_problems_.find(shape);
  if (it != schedule_problems_.end()) return it->second;
  std::string why;
  try {
    parallel::check_schedule_shape(layout.schedule, layout.pp, micro, layout.chunks, request_.source);
  } catch (const ConfigError& e) {
    why = e.what();
  }
  return schedule_problems_.emplace(shape, std::move(why)).first->second;
}

Prediction Planner::predict(const Layout& layout) {
  const ModelConfig& cfg = request_.model.config;
  const auto T = static_cast<double>(cfg.seq_len), C = static_cast<double>(cfg.d_model);
  const double ab = activation_bytes();
  const double tokens = rank_tokens(layout);
  const int64_t micro = request_.global_batch / (layout.dp * layout.ep * layout.micro_batch);
  const std::vector<RankCost> ranks = rank_costs(layout);

  // The mesh's order: tp fastest, then cp, ep, pp, dp. The gradients are reduced over dp × cp, the
  // replicas; with cp > 1 the trainer runs no pp, so dp and cp ranks are tp · ep apart.
  LS_CHECK(layout.cp == 1 || layout.pp == 1);
  const int64_t replicas = layout.dp * layout.cp;
  const Link& tp_link = group_link(cluster_, 1, layout.tp);
  const Link& cp_link = group_link(cluster_, layout.tp, layout.cp);
  const Link& ep_link = group_link(cluster_, layout.tp * layout.cp, layout.ep);
  const Link& pp_link = group_link(cluster_, layout.tp * layout.cp * layout.ep, layout.pp);
  // With cp, a replica group's ranks span the cp and ep ranks between its dp ranks.
  const Link& replica_link = layout.cp == 1 ? group_link(cluster_, layout.tp * layout.ep * layout.pp, layout.dp)
                                            : group_link(cluster_, layout.tp, replicas * layout.ep);
  const double reduce = reduction_time(tokens * C * ab, layout.tp, tp_link);
  // Context parallelism, per attention layer: every position's k and v of the micro-batch (fp32)
  // all-gathered, and their gradients reduced.
  const double kv_bytes = 4 * static_cast<double>(layout.micro_batch) * T *
                          static_cast<double>(2 * cfg.n_kv_heads * cfg.head_size() / layout.tp);
  const double kv_gather = all_gather(kv_bytes, layout.cp, cp_link);
  const double kv_reduce = reduction_time(kv_bytes, layout.cp, cp_link);
  // Expert parallelism: a MoE layer's rows (top_k a token) to their experts' ranks and back, in
  // the forward and again in the backward.
  const double exchange =
      all_to_all_time(request_.moe_load * tokens * static_cast<double>(cfg.moe_top_k) * C * ab, layout.ep, ep_link);
  // Each pipeline rank's passes of a micro-batch, the collectives in them included; the busiest
  // rank's are the step's compute and tensor-parallel parts.
  const double ch = static_cast<double>(layout.chunks);
  const double p2p = send_time(tokens * C * ab * (layout.sp ? 1.0 / static_cast<double>(layout.tp) : 1.0), pp_link);
  std::vector<parallel::PassCosts> by_rank;
  double forward = 0, backward = 0, compute = 0, recompute = 0, streaming = 0, comm = 0, ep_comm = 0, cp_comm = 0;
  for (const RankCost& r : ranks) {
    const Passes t = passes(layout, r);
    const double rc = t.recompute;
    const double fc = static_cast<double>(r.forward_reduces) * reduce;
    const double bc = static_cast<double>(r.backward_reduces + r.recompute_reduces) * reduce;
    const double ex = static_cast<double>(r.moe_layers) * 2 * exchange;  // each way
    const auto attention = static_cast<double>(r.attention_layers);
    const double cf = attention * kv_gather;
    const double cb = (attention + static_cast<double>(r.recomputed_attention)) * kv_gather + attention * kv_reduce;
    const double f = t.forward + fc + ex + cf, b = t.backward + rc + bc + ex + cb;
    if (layout.schedule == parallel::ScheduleKind::kZeroBubble) {
      by_rank.push_back({f / ch, b * t.input_share / ch, b * t.weight_share / ch, p2p});
    } else {
      by_rank.push_back({f / ch, b / (2 * ch), b / (2 * ch), p2p});  // B = Bi + W
    }
    if (f + b <= forward + backward) continue;
    forward = f;
    backward = b;
    compute = t.forward + t.backward + rc;
    recompute = rc;
    streaming = t.streaming;
    comm = fc + bc;
    ep_comm = 2 * ex;
    cp_comm = cf + cb;
  }
  Prediction p;
  p.layout = layout;
  p.micro_batches = micro;
  const double busy = static_cast<double>(micro) * (forward + backward);
  std::vector<int64_t> in_flight(ranks.size(), 1);
  double makespan = busy;
  if (layout.pp > 1) {
    // The head's gradient of a tied wte, sent from the last rank to the first (fp32, its tp shard).
    const LayerDesc& head = request_.model.layers.back();
    const parallel::TiedEmbedding tied{
        head.kind == LayerKind::kHead && head.tied,
        send_time(4 * static_cast<double>(head.dims.V * head.dims.C) / static_cast<double>(layout.tp), pp_link)};
    const PipelineTime tl = timeline(layout, micro, by_rank, tied);
    makespan = tl.makespan;
    in_flight = tl.chunk_slots;  // the trainer's activation sets: each chunk its own peak
  }
  p.time.compute = static_cast<double>(micro) * compute;
  p.time.recompute = static_cast<double>(micro) * recompute;
  p.time.streaming = static_cast<double>(micro) * streaming;
  p.time.tp_comm = static_cast<double>(micro) * comm;
  p.time.ep_comm = static_cast<double>(micro) * ep_comm;
  p.time.cp_comm = static_cast<double>(micro) * cp_comm;
  p.time.pipeline = makespan - busy;

  // Memory, the data-parallel exposure and the optimizer, rank by rank.
  const auto shards = static_cast<double>(replicas);  // ZeRO's, over dp × cp
  double exposed = 0, optimizer = 0, state_at_rest = 0, held_params = 0;
  for (const RankCost& r : ranks) held_params += r.params;
  // The reduction in buckets of at most bucket_bytes, one after the other.
  const auto bucketed = [&](double bytes, const std::function<double(double)>& time) {
    const double full = std::floor(bytes / request_.bucket_bytes), rest = bytes - full * request_.bucket_bytes;
    return full * time(request_.bucket_bytes) + (rest > 0 ? time(rest) : 0);
  };
  const bool overlap = cluster_.comm_beside_compute;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankCost& r = ranks[i];
    const double fp32 = r.params * 4;  // the parameters, and the gradients as the reduction sends them
    const bool zero3 = replicas > 1 && layout.zero == 3;
    Memory m;
    if (zero3) {
      // The shard, and two windows of the largest layer's parameters (a bf16 linear's weight is
      // rounded in its window: no copy); in bf16 and fp8 the shard rounded to bf16 too, which the
      // gathers send (zero3_params.hpp).
      m.params = fp32 / shards + 2 * 4 * *std::max_element(r.layer_params.begin(), r.layer_params.end());
      if (request_.precision != Precision::kF32) m.params += 2 * r.params / shards;
    } else {
      m.params = fp32;
      m.params += r.matmul_params * weight_copy_bytes();
    }
    // Canonical mode's gradients keep exact sums beside the fp32 ones: a double and a flag each.
    const double held = request_.mode == Mode::kCanonical ? r.params * 13 : fp32;
    const bool sharded = replicas > 1 && layout.zero >= 2;
    m.grads = sharded ? held / shards + std::min(fp32, request_.bucket_bytes) : held;
    if (replicas > 1) m.grads += dp_reduction_bytes(fp32, shards, sharded);
    if (layout.ep > 1) {
      // The sum of the replicated gradients over ep, a bucket at a time (all of them without dp):
      // their indices, and (canonical) every ep rank's doubles, or (fast) an fp32 copy.
      const double n = replicas > 1 ? std::min(r.replicated_params, request_.bucket_bytes / 4) : r.replicated_params;
      m.grads += n * (8 + (request_.mode == Mode::kCanonical ? 8 * static_cast<double>(layout.ep + 1) : 4));
    }
    m.optimizer = r.params * 8 / (layout.zero >= 1 ? shards : 1);
    const double in_flight_tokens = static_cast<double>(in_flight[i]) * tokens / static_cast<double>(layout.chunks);
    const bool split = layout.pp > 1 && layout.schedule == parallel::ScheduleKind::kZeroBubble;
    m.activations = in_flight_tokens * (r.kept_bytes + (split ? r.deferred_bytes : 0)) +
                    (r.rebuilt_bytes + r.scratch_bytes) * tokens +
                    (r.cp_held_bytes + r.cp_reduce_bytes) * static_cast<double>(layout.micro_batch) * T +
                    packed_operands(r, tokens) + tp_exact_reduction_bytes(layout, tokens);
    m.reserved = cluster_.reserved_bytes;
    if (m.total() > p.memory.total()) p.memory = m;
    // The update: measured (over dp from ZeRO 1), or on a declared cluster its bytes at the
    // streaming rate — the gradients this rank holds (over dp from ZeRO 2) and AdamW over its shard.
    if (profile_ != nullptr) {
      const double update = profile_->at(pass_shape(layout, Recompute::kNone)).optimizer * r.params / held_params;
      optimizer = std::max(optimizer, layout.zero >= 1 ? update / shards : update);
    } else if (cluster_.stream_bandwidth > 0) {
      const double owned = layout.zero >= 1 ? 1 / shards : 1, held = layout.zero >= 2 ? 1 / shards : 1;
      optimizer = std::max(optimizer, update_traffic(r.params * held, r.params * owned, r.matmul_params * owned,
                                                     request_.precision) /
                                          cluster_.stream_bandwidth);
    }
    // The state-at-rest detector's hashes, of the parameters (over dp with ZeRO 3) and the two
    // moments (over dp from ZeRO 1): the measured figure is for all three whole.
    const double resting = ((zero3 ? 1 / shards : 1) + 2 * (layout.zero >= 1 ? 1 / shards : 1)) / 3;
    if (profile_ != nullptr) {
      const double rank_whole = profile_->at(pass_shape(layout, Recompute::kNone)).state_at_rest * r.params / held_params;
      state_at_rest = std::max(state_at_rest, rank_whole * resting);
    } else if (request_.state_at_rest && cluster_.stream_bandwidth > 0) {
      state_at_rest = std::max(state_at_rest, 2 * 12 * r.params * resting / cluster_.stream_bandwidth);
    }
    // Expert parallelism: the replicated tensors' gradients summed over ep before the dp reduction
    // (canonical: every ep rank's doubles all-gathered; fast: an fp32 all-reduce).
    const double ep_sum =
        layout.ep == 1 ? 0
        : request_.mode == Mode::kCanonical
            ? all_gather(8 * r.replicated_params * static_cast<double>(layout.ep), layout.ep, ep_link)
            : all_reduce(4 * r.replicated_params, layout.ep, ep_link);
    if (replicas == 1) {
      exposed = std::max(exposed, ep_sum);  // after the backward, no buckets to overlap
      continue;
    }
    // Buckets reduced during the backward: exposed, the part longer than the backward it overlaps
    // and at least the last bucket's — or all of it where communication takes the compute's core.
    const double bucket = std::min(fp32, request_.bucket_bytes);
    const auto after_backward = [&](double sync, double last) {
      return overlap ? std::max(sync - backward, last) : sync;
    };
    double e = 0;
    if (sharded) {
      const auto scatter = [&](double b) { return scatter_time(b, replicas, replica_link, fp32 / shards); };
      e = static_cast<double>(micro) * after_backward(bucketed(fp32, scatter) + ep_sum, scatter(bucket));
      if (zero3) {
        e += gathers_exposed(r.layer_gather_bytes, micro, busy, replica_link, replicas);
      } else {
        e += all_gather(fp32, replicas, replica_link);  // the parameters'
      }
    } else {
      const auto reduce_bucket = [&](double b) { return gradient_reduction_time(b, replicas, replica_link, fp32 / shards); };
      e = after_backward(bucketed(fp32, reduce_bucket) + ep_sum, reduce_bucket(bucket));
      if (layout.zero == 1) e += all_gather(fp32, replicas, replica_link);  // the parameters'
    }
    exposed = std::max(exposed, e);
  }
  p.time.dp_exposed = exposed;
  p.time.optimizer = optimizer;
  p.time.state_at_rest = state_at_rest;
  const bool synchronised = replicas > 1 || layout.tp > 1 || layout.ep > 1;
  p.time.skew = synchronised ? cluster_.sync_skew * p.time.compute : 0;
  p.time.total = makespan + exposed + p.time.skew + optimizer + state_at_rest;
  const double step_tokens = static_cast<double>(request_.global_batch) * T;
  p.tokens_per_s = step_tokens / p.time.total;
  const double peak = static_cast<double>(cluster_.gpus()) * cluster_.peak(request_.precision);
  const double model_flops = flops_per_token(request_.model);
  p.mfu = model_flops * p.tokens_per_s / peak;
  p.hfu = (model_flops + model_recompute_flops(layout.recompute)) * p.tokens_per_s / peak;
  return p;
}

Problem Planner::fits(const Prediction& p) const {
  const double need = p.memory.total();
  if (need <= cluster_.hbm_bytes) return {};
  const auto gib = [](double bytes) { return std::round(bytes / kGiB * 10) / 10; };
  return {"memory", str_cat("needs ", gib(need), " GiB a GPU, over the ", cluster_.hbm_bytes / kGiB, " GiB of HBM by ",
                            gib(need - cluster_.hbm_bytes), " GiB")};
}

SearchResult Planner::search() {
  SearchResult out;
  const int64_t N = cluster_.gpus();
  const auto reject = [&](const Layout& l, const Problem& why) {
    SearchResult::Rejection& r = out.rejected[why.kind];
    if (r.count++ > 0) return;
    r.example = l;
    r.text = why.text;
  };
  // Expert parallelism: the divisors of a MoE model's routed experts (1 for a dense model).
  std::vector<int64_t> eps = {1};
  for (int64_t ep = 2; ep <= request_.model.config.moe_experts; ++ep) {
    if (request_.model.config.moe_experts % ep == 0) eps.push_back(ep);
  }
  for (int64_t tp = 1; tp <= cluster_.gpus_per_node && N % tp == 0; tp *= 2) {
    for (int64_t pp = 1; pp <= N / tp; ++pp) {
      if ((N / tp) % pp != 0) continue;
      for (int64_t ep : eps) {
        if ((N / (tp * pp)) % ep != 0) continue;
        // Context parallelism: powers of two of the replicas (dp x cp); the trainer's check decides the rest.
        for (int64_t cp = 1; (N / (tp * pp * ep)) % cp == 0; cp *= 2) {
          for (int64_t mb : kSearchedMicroBatches) {
            // Without replicas the ZeRO stages are one layout.
            for (int zero = 0; zero <= (N / (tp * pp * ep) > 1 ? parallel::kMaxZeroStage : 0); ++zero) {
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                for (Recompute rc : kRecomputes) {
                  // A pipeline runs 1F1B, zero-bubble, or interleaved with each rank holding
                  // kSearchedChunks stages.
                  for (const auto& [schedule, chunks] : kSearchedSchedules) {
                    if (pp == 1 && schedule != parallel::ScheduleKind::kOneFOneB) continue;
                    const Layout l{.dp = N / (tp * pp * ep * cp),
                                   .tp = tp,
                                   .pp = pp,
                                   .cp = cp,
                                   .ep = ep,
                                   .chunks = chunks,
                                   .micro_batch = mb,
                                   .zero = zero,
                                   .sp = sp,
                                   .recompute = rc,
                                   .schedule = schedule};
                    ++out.considered;
                    if (Problem why = problem(l); !why.empty()) {
                      reject(l, why);
                      continue;
                    }
                    Prediction p = predict(l);
                    // Where the all-gather's probabilities do not fit, the ring (more compute, the
                    // same bytes, less memory); where they fit, the ring would only be slower.
                    if (l.cp > 1 && !fits(p).empty()) {
                      Layout ring = l;
                      ring.ring = true;
                      p = predict(ring);
                    }
                    if (!out.any_predicted || p.memory.total() < out.least_memory.memory.total()) out.least_memory = p;
                    out.any_predicted = true;
                    if (Problem why = fits(p); !why.empty()) {
                      reject(l, why);
                      continue;
                    }
                    out.ranked.push_back(p);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::sort(out.ranked.begin(), out.ranked.end(), [](const Prediction& a, const Prediction& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    if (a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
    return a.layout.text() < b.layout.text();
  });
  return out;
}

}  // namespace lockstep::plan
