#include "src/plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "src/core/check.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/train/pipeline.hpp"

namespace lockstep::plan {

namespace {

constexpr double kBucketBytes = 25.0 * (1 << 20);  // the trainer's default [parallel] bucket_mb

}  // namespace

// What one pipeline rank holds and does, per token of a micro-batch unless said otherwise.
struct Planner::RankCost {
  double forward_flops = 0;    // its layers' forward (a third of the trained FLOPs)
  double recompute_flops = 0;  // forwards run again before their backward
  int64_t forward_reduces = 0, backward_reduces = 0, recompute_reduces = 0;  // tp all-reduces a micro-batch
  double params = 0, matmul_params = 0;  // elements this GPU holds
  double kept_bytes = 0;     // activations a micro-batch keeps until its backward
  double rebuilt_bytes = 0;  // the largest recomputed layer's, rebuilt one at a time
};

Planner::Planner(PlanRequest request, Cluster cluster) : request_(std::move(request)), cluster_(std::move(cluster)) {
  const LayerDesc& last = request_.model.layers.back();
  if (last.kind == LayerKind::kHead && last.tied) {
    head_flops_ = 6.0 * static_cast<double>(last.dims.V) * static_cast<double>(last.dims.C);
  }
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
  const double stream = layout.sp ? 1 / t : 1;  // the residual stream and the norms' outputs
  const double ab = request_.precision == Precision::kF32 ? 4 : 2;
  std::vector<RankCost> ranks;
  for (const std::vector<size_t>& held : rank_layers(layout.pp, layout.chunks)) {
    RankCost r;
    for (size_t i : held) {
      const LayerDesc& l = request_.model.layers[i];
      const LayerDims& m = l.dims;
      const auto C = static_cast<double>(m.C), T = static_cast<double>(m.T);
      double flops = layer_flops_per_token(l);
      if (l.kind == LayerKind::kEmbedding) flops -= head_flops_;
      if (l.kind == LayerKind::kHead) flops += head_flops_;
      r.forward_flops += flops / 3;
      for (const ParamDecl& p : l.params) {
        const auto whole = static_cast<double>(param_numel(p));
        const double n = p.split_dim >= 0 ? whole / t : whole;
        r.params += n;
        if (p.matmul) r.matmul_params += n;
      }
      double input = 0, inside = 0;
      bool recomputed = false;
      switch (l.kind) {
        case LayerKind::kEmbedding:
          ++r.forward_reduces;
          break;
        case LayerKind::kAttention:
          ++r.forward_reduces;
          ++r.backward_reduces;
          input = C * stream;
          inside = C * stream + static_cast<double>(m.qkv_width()) / t + static_cast<double>(m.NH) / t * T +
                   static_cast<double>(m.NH * m.HS) / t;
          recomputed = layout.recompute != Recompute::kNone;
          break;
        case LayerKind::kMlp:
          ++r.forward_reduces;
          ++r.backward_reduces;
          input = C * stream;
          inside = C * stream + static_cast<double>(m.F) * (l.ffn == FfnKind::kSwiglu ? 3 : 2) / t;
          recomputed = layout.recompute == Recompute::kFull;
          break;
        case LayerKind::kFinalNorm:
          input = C * stream;
          inside = C * stream;
          break;
        case LayerKind::kHead:
          ++r.backward_reduces;
          // fp32 logits of this rank's vocabulary share, and (tied, on a stage of its own) the copy of wte
          r.kept_bytes += static_cast<double>(m.V) / t * 4;
          if (l.tied && layout.pp > 1) {
            r.params += static_cast<double>(m.V) * C / t;
            r.matmul_params += static_cast<double>(m.V) * C / t;
          }
          break;
      }
      if (recomputed) {
        r.recompute_flops += flops / 3;
        ++r.recompute_reduces;
        r.kept_bytes += input * ab;
        r.rebuilt_bytes = std::max(r.rebuilt_bytes, (input + inside) * ab);
      } else {
        r.kept_bytes += (input + inside) * ab;
      }
    }
    ranks.push_back(r);
  }
  return ranks;
}

Problem Planner::problem(const Layout& layout) {
  const ModelConfig& cfg = request_.model.config;
  const int64_t B = request_.global_batch, T = cfg.seq_len;
  if (layout.gpus() != cluster_.gpus()) {
    return {"gpus", str_cat("dp x tp x pp = ", layout.gpus(), " GPUs, the cluster has ", cluster_.gpus())};
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
  if (layout.pp > 1 && !trainer_runs(layout.schedule)) {
    return {"schedule", str_cat("the trainer runs the gpipe and 1f1b schedules, not ",
                                parallel::schedule_name(layout.schedule))};
  }
  // The trainer's own checks: the batch split, the schedule's shape, tensor parallelism, stages.
  parallel::DpBatch split;
  try {
    split = parallel::plan_dp_batch(B, layout.micro_batch, T, layout.dp, Mode::kFast, request_.source);
  } catch (const ConfigError& e) {
    return {"batch split", e.what()};
  }
  // The trainer shrinks a micro-batch larger than a replica's share; here that is the smaller layout.
  if (split.local_micro != layout.micro_batch) {
    return {"batch split", str_cat("a replica's ", split.local_batch, " sequences are fewer than a micro-batch of ",
                                   layout.micro_batch)};
  }
  const int64_t micro = split.local_batch / split.local_micro;
  try {
    parallel::make_schedule(layout.schedule, layout.pp, micro, layout.chunks, request_.source);
  } catch (const ConfigError& e) {
    return {"schedule", e.what()};
  }
  try {
    parallel::check_tp_layout(cfg, layout.tp, layout.sp, layout.micro_batch * T, Mode::kFast, request_.source);
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

parallel::Timeline Planner::timeline(const Layout& layout, int64_t micro, const parallel::PassCosts& costs) {
  const auto key = std::make_tuple(static_cast<int>(layout.schedule), layout.pp, micro, layout.chunks, costs.forward,
                                   costs.backward_input, costs.backward_weight, costs.p2p);
  auto it = timelines_.find(key);
  if (it == timelines_.end()) {
    const parallel::PipelineSchedule s =
        parallel::make_schedule(layout.schedule, layout.pp, micro, layout.chunks, request_.source);
    it = timelines_.emplace(key, parallel::simulate(s, costs)).first;
  }
  return it->second;
}

Prediction Planner::predict(const Layout& layout) {
  const ModelConfig& cfg = request_.model.config;
  const auto T = static_cast<double>(cfg.seq_len), C = static_cast<double>(cfg.d_model);
  const double ab = request_.precision == Precision::kF32 ? 4 : 2;
  const double rate = cluster_.gemm_flops(request_.precision) * static_cast<double>(layout.tp);
  const double tokens = static_cast<double>(layout.micro_batch) * T;
  const int64_t micro = request_.global_batch / (layout.dp * layout.micro_batch);
  const std::vector<RankCost> ranks = rank_costs(layout);

  const Link& tp_link = group_link(cluster_, 1, layout.tp);
  const Link& pp_link = group_link(cluster_, layout.tp, layout.pp);
  const Link& dp_link = group_link(cluster_, layout.tp * layout.pp, layout.dp);
  const double reduce = all_reduce_time(tokens * C * ab, layout.tp, tp_link);
  // The busiest rank's passes (every rank is timed with them: the pipeline runs at its pace).
  double forward = 0, backward = 0, gemm = 0, recompute = 0, comm = 0;
  for (const RankCost& r : ranks) {
    const double f = r.forward_flops * tokens / rate, rc = r.recompute_flops * tokens / rate;
    const double fc = static_cast<double>(r.forward_reduces) * reduce;
    const double bc = static_cast<double>(r.backward_reduces + r.recompute_reduces) * reduce;
    if (f + fc + 2 * f + rc + bc <= forward + backward) continue;
    forward = f + fc;
    backward = 2 * f + rc + bc;
    gemm = 3 * f + rc;
    recompute = rc;
    comm = fc + bc;
  }
  Prediction p;
  p.layout = layout;
  p.micro_batches = micro;
  const double busy = static_cast<double>(micro) * (forward + backward);
  std::vector<int64_t> in_flight(ranks.size(), 1);
  double makespan = busy;
  if (layout.pp > 1) {
    const double ch = static_cast<double>(layout.chunks);
    const double p2p = send_time(tokens * C * ab * (layout.sp ? 1.0 / static_cast<double>(layout.tp) : 1.0), pp_link);
    const parallel::Timeline tl =
        timeline(layout, micro, {forward / ch, backward / (2 * ch), backward / (2 * ch), p2p});
    makespan = tl.makespan;
    in_flight = tl.peak_in_flight;
  }
  p.time.compute = static_cast<double>(micro) * gemm;
  p.time.recompute = static_cast<double>(micro) * recompute;
  p.time.tp_comm = static_cast<double>(micro) * comm;
  p.time.pipeline = makespan - busy;

  // Memory and the data-parallel exposure, rank by rank.
  const auto dp = static_cast<double>(layout.dp);
  double exposed = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankCost& r = ranks[i];
    Memory m;
    m.params = r.params * 4;
    if (request_.precision != Precision::kF32) m.params += r.matmul_params * 2;   // the bf16 copy
    if (request_.precision == Precision::kFp8) m.params += r.matmul_params * 2;   // rowwise and columnwise fp8
    const double grads = r.params * 4, params32 = r.params * 4;
    const bool sharded = layout.dp > 1 && layout.zero >= 2;
    m.grads = sharded ? grads / dp + std::min(grads, kBucketBytes) : grads;
    m.optimizer = r.params * 8 / (layout.zero >= 1 ? dp : 1);
    const double in_flight_tokens = static_cast<double>(in_flight[i]) * tokens / static_cast<double>(layout.chunks);
    m.activations = in_flight_tokens * r.kept_bytes + r.rebuilt_bytes * tokens;
    m.reserved = cluster_.reserved_bytes;
    if (m.total() > p.memory.total()) p.memory = m;
    if (layout.dp == 1) continue;
    const double bucket = std::min(grads, kBucketBytes);
    double e = 0;
    if (sharded) {
      const double per_micro = std::max(reduce_scatter_time(grads, layout.dp, dp_link) - backward,
                                        reduce_scatter_time(bucket, layout.dp, dp_link));
      e = static_cast<double>(micro) * per_micro + all_gather_time(params32, layout.dp, dp_link);
    } else {
      const double sync = all_reduce_time(grads, layout.dp, dp_link);
      e = std::max(sync - backward, all_reduce_time(bucket, layout.dp, dp_link));
      if (layout.zero == 1) e += all_gather_time(params32, layout.dp, dp_link);
    }
    exposed = std::max(exposed, e);
  }
  p.time.dp_exposed = exposed;
  p.time.total = makespan + exposed;
  const double step_tokens = static_cast<double>(request_.global_batch) * T;
  p.tokens_per_s = step_tokens / p.time.total;
  p.mfu = flops_per_token(request_.model) * p.tokens_per_s /
          (static_cast<double>(cluster_.gpus()) * cluster_.peak(request_.precision));
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
  for (int64_t tp = 1; tp <= cluster_.gpus_per_node && N % tp == 0; tp *= 2) {
    for (int64_t pp = 1; pp <= N / tp; ++pp) {
      if ((N / tp) % pp != 0) continue;
      for (int64_t mb : {1, 2, 4, 8, 16}) {
        // Without data parallelism the ZeRO stages are one layout.
        for (int zero = 0; zero <= (N / (tp * pp) > 1 ? parallel::kMaxZeroStage : 0); ++zero) {
          for (bool sp : {false, true}) {
            if (sp && tp == 1) continue;
            for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
              const Layout l{
                  .dp = N / (tp * pp), .tp = tp, .pp = pp, .micro_batch = mb, .zero = zero, .sp = sp, .recompute = rc};
              ++out.considered;
              if (Problem why = problem(l); !why.empty()) {
                reject(l, why);
                continue;
              }
              const Prediction p = predict(l);
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
  std::sort(out.ranked.begin(), out.ranked.end(), [](const Prediction& a, const Prediction& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    if (a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
    return a.layout.text() < b.layout.text();
  });
  return out;
}

}  // namespace lockstep::plan
