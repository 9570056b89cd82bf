#include "src/plan/compute_profile.hpp"

#include <chrono>
#include <optional>
#include <sstream>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/core/check.hpp"
#include "src/core/splitmix64.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/optim/grad_clip.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/parallel/tp_plan.hpp"
#include "src/plan/layout.hpp"
#include "src/plan/solo_communicator.hpp"
#include "src/plan/solo_tp_group.hpp"
#include "src/train/bench.hpp"
#include "src/train/detectors.hpp"

namespace lockstep::plan {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<PassShape> profile_shapes(const RunConfig& run, int64_t ranks, int64_t global_batch) {
  parallel::CpRun cp_run;
  cp_run.precision = run.train.precision_recipe();
  std::vector<PassShape> shapes;
  for (int64_t tp = 1; tp <= ranks; tp *= 2) {
    for (int64_t cp = 1; tp * cp <= ranks; cp *= 2) {
      try {
        parallel::check_cp_layout(run.model, cp, cp_run, run.source);
      } catch (const ConfigError&) {
        continue;  // a layout the trainer refuses: never predicted
      }
      for (bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (int64_t mb : kSearchedMicroBatches) {
          if (mb > global_batch) continue;
          try {
            parallel::check_tp_layout(run.model, tp, sp, mb * run.model.seq_len / cp, run.train.mode, run.source);
          } catch (const ConfigError&) {
            continue;
          }
          for (bool ring : {false, true}) {
            if (ring && cp == 1) continue;
            for (Recompute rc : kRecomputes) shapes.push_back({tp, sp, mb, rc, cp, ring});
          }
        }
      }
    }
  }
  return shapes;
}

PassTimes time_passes(const RunConfig& run, const PassShape& shape, int64_t repeats) {
  LS_REQUIRE(repeats >= 1, "time_passes: repeats must be >= 1");
  const TrainConfig& tc = run.train;
  CpuBackend backend({1, tc.isa, tc.fast_gemm});
  SoloTpGroup group(shape.tp);
  std::optional<parallel::TensorParallelPlan> tp_plan;
  if (shape.tp > 1) tp_plan.emplace(group, shape.sp);
  const ModelPlan one_device;
  SoloCommunicator cp_group(static_cast<int>(shape.cp), "cp");
  std::optional<parallel::ContextParallelPlan> cp_plan;
  if (shape.cp > 1) {
    cp_plan.emplace(tp_plan ? static_cast<const ModelPlan&>(*tp_plan) : one_device, cp_group,
                    shape.ring ? parallel::CpComm::kP2p : parallel::CpComm::kAllGather);
  }
  const ModelPlan* plan = cp_plan ? static_cast<const ModelPlan*>(&*cp_plan) : tp_plan ? &*tp_plan : nullptr;
  const ModelOptions options{.plan = plan,
                             .backend = &backend,
                             .precision = tc.precision_recipe(),
                             .recompute = shape.recompute};
  Model model(run.model, tc.mode, shape.micro_batch, options);
  model.init_parameters();
  AdamW adamw(model, tc.adamw());
  // The split backward's model, timed in turn with the other so that both see the same machine.
  std::optional<Model> split;
  if (shape.recompute == Recompute::kNone) {
    ModelOptions o = options;
    o.split_backward = true;
    split.emplace(run.model, tc.mode, shape.micro_batch, o);
    split->init_parameters();
  }

  // Uniform tokens (a pass's cost does not depend on their values).
  const int64_t T = run.model.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(shape.micro_batch * T)), targets(inputs.size());
  SplitMix64 rng(tc.seed);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(run.model.vocab_size)));
    targets[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(run.model.vocab_size)));
  }
  const MicroBatch batch{inputs.data(), targets.data(), shape.micro_batch, 0};
  const float dloss = 1.0f / static_cast<float>(shape.micro_batch * T);
  // The state-at-rest detector as the trainer runs it: its hashes beside the passes, so that they
  // read the state from where the passes left the caches.
  comm::SelfCommunicator self;
  std::ostringstream no_findings;  // the state does not change between its hashes here
  detect::FindingLog findings(no_findings, {});
  std::optional<detect::StateAtRestDetector> at_rest;
  if (run.verify.state_at_rest) {
    at_rest.emplace(resting_state(model, adamw), self, findings, detect::FaultAction::kWarn);
  }

  // Untimed passes first: the first touch their buffers, and a process's first milliseconds run
  // slower than its steady state.
  constexpr int64_t kUntimed = 3;
  std::vector<double> forward, backward, optimizer, backward_input, backward_weight, state_at_rest;
  for (int64_t i = 0; i < kUntimed + repeats; ++i) {
    ChunkCombiner loss;
    auto t0 = std::chrono::steady_clock::now();
    if (at_rest) at_rest->begin_step(i);
    double hashes = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    double o = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.forward(0, batch);
    const double f = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.backward(0, dloss, loss, true);
    const double b = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    model.finish_grads();
    clip_grad_norm(model, static_cast<float>(tc.grad_clip));
    adamw.update(model, tc.lr, i + 1);
    o += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    if (at_rest) at_rest->after_update(i);
    hashes += seconds_since(t0);
    double bi = 0, w = 0;
    if (split) {
      ChunkCombiner split_loss;
      split->zero_grad();
      split->forward(0, batch);
      t0 = std::chrono::steady_clock::now();
      split->backward(0, dloss, split_loss, true);
      bi = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      split->backward_weight(0, true);
      w = seconds_since(t0);
    }
    if (i < kUntimed) continue;
    forward.push_back(f);
    backward.push_back(b);
    optimizer.push_back(o);
    backward_input.push_back(bi);
    backward_weight.push_back(w);
    state_at_rest.push_back(hashes);
  }
  // Medians, as a run's step time is its steps' median.
  return {stats_of(forward).median,        stats_of(backward).median,        stats_of(optimizer).median,
          stats_of(backward_input).median, stats_of(backward_weight).median, stats_of(state_at_rest).median};
}

const PassTimes& ComputeProfile::at(const PassShape& shape) const {
  const auto it = times_.find(shape);
  LS_CHECK(it != times_.end(), "no measured passes for tp ", shape.tp, shape.sp ? " sp" : "", " cp ", shape.cp,
           shape.ring ? " p2p" : "", " micro-batch ", shape.micro_batch, " recompute ", recompute_name(shape.recompute));
  return it->second;
}

nlohmann::json ComputeProfile::to_json() const {
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& [s, t] : times_) {
    shapes.push_back({{"tp", s.tp}, {"sp", s.sp}, {"cp", s.cp}, {"ring", s.ring},
                      {"micro_batch", s.micro_batch},
                      {"recompute", recompute_name(s.recompute)}, {"forward_s", t.forward},
                      {"backward_s", t.backward}, {"optimizer_s", t.optimizer},
                      {"backward_input_s", t.backward_input}, {"backward_weight_s", t.backward_weight},
                      {"state_at_rest_s", t.state_at_rest}});
  }
  return {{"passes", shapes},
          {"runtime_mib", runtime_bytes / (1 << 20)},
          {"peak_fp32_gflops", peak_fp32_flops / 1e9},
          {"peak_bf16_gflops", peak_bf16_flops / 1e9},
          {"bf16_weight_copy", bf16_weight_copy}};
}

ComputeProfile ComputeProfile::from_json(const nlohmann::json& j, const std::string& where) {
  ComputeProfile p;
  try {
    p.runtime_bytes = j.at("runtime_mib").get<double>() * (1 << 20);
    p.peak_fp32_flops = j.at("peak_fp32_gflops").get<double>() * 1e9;
    p.peak_bf16_flops = j.at("peak_bf16_gflops").get<double>() * 1e9;
    p.bf16_weight_copy = j.at("bf16_weight_copy").get<bool>();
    for (const auto& s : j.at("passes")) {
      p.set({s.at("tp").get<int64_t>(), s.at("sp").get<bool>(), s.at("micro_batch").get<int64_t>(),
             parse_recompute(s.at("recompute").get<std::string>(), where), s.at("cp").get<int64_t>(),
             s.at("ring").get<bool>()},
            {s.at("forward_s").get<double>(), s.at("backward_s").get<double>(), s.at("optimizer_s").get<double>(),
             s.at("backward_input_s").get<double>(), s.at("backward_weight_s").get<double>(),
             s.at("state_at_rest_s").get<double>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(where, ": not a `lockstep bench --passes` report (", e.what(), ")"));
  }
  return p;
}

}  // namespace lockstep::plan
