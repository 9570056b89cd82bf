// `lockstep plan --model FILE --cluster FILE --global-batch B [--seq-len T] [--precision P]
// [--top N] [--json FILE] [--svg FILE] [--explain LAYOUT]`: the layouts of a run on a cluster,
// ranked by the planner's predicted step time (src/plan/planner.hpp), each with its time and
// memory broken down (as bars in the SVG), and every rejected layout counted by its reason; or one
// layout's prediction in full.
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/plan/goodput.hpp"
#include "src/plan/planner.hpp"
#include "src/train/config.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kPlanUsage =
    "usage: lockstep plan --model FILE.toml --cluster FILE.toml --global-batch B [--seq-len T]\n"
    "                     [--precision fp32|bf16|fp8] [--top N] [--json FILE] [--svg FILE] [--explain LAYOUT]\n"
    "  ranks the layouts the trainer runs (dp x tp x pp of the cluster's GPUs, micro-batch, ZeRO 0-2,\n"
    "  sequence parallelism, recomputation, 1F1B) by predicted step time and prints the best N\n"
    "  (default 10) with time and memory broken down (--svg: as bars), and the rejected layouts by reason.\n"
    "  --model: a run config (its [model] section); --cluster: scripts/clusters/*.toml.\n"
    "  --explain 'dp16 tp8 pp8 mb1 zero1 sp 1f1b recompute=selective': one layout in full.\n";

using plan::kGiB;

std::string fixed(double x, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << x;
  return s.str();
}

nlohmann::json to_json(const plan::Prediction& p) {
  return {{"layout", p.layout.text()},
          {"step_s", p.time.total},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"micro_batches", p.micro_batches},
          {"time_s",
           {{"compute", p.time.compute},
            {"recompute", p.time.recompute},
            {"tp_comm", p.time.tp_comm},
            {"pipeline", p.time.pipeline},
            {"dp_exposed", p.time.dp_exposed}}},
          {"memory_gib",
           {{"params", p.memory.params / kGiB},
            {"grads", p.memory.grads / kGiB},
            {"optimizer", p.memory.optimizer / kGiB},
            {"activations", p.memory.activations / kGiB},
            {"reserved", p.memory.reserved / kGiB},
            {"total", p.memory.total() / kGiB}}}};
}

// The shown layouts' step time and memory, each a row of stacked bars.
std::string plan_svg(const std::vector<plan::Prediction>& shown, const std::string& title) {
  std::vector<std::string> rows;
  std::vector<verify::TimelineBar> time, memory;
  for (size_t i = 0; i < shown.size(); ++i) {
    const plan::Prediction& p = shown[i];
    rows.push_back(str_cat(i + 1, ". ", p.layout.text()));
    double at = 0;
    const double parts[] = {p.time.compute, p.time.tp_comm, p.time.pipeline, p.time.dp_exposed};
    for (size_t s = 0; s < 4; ++s) {
      time.push_back({i, at, at + parts[s], fixed(parts[s], 2), s});
      at += parts[s];
    }
    at = 0;
    const plan::Memory& m = p.memory;
    const double held[] = {m.params, m.grads, m.optimizer, m.activations, m.reserved};
    for (size_t s = 0; s < 5; ++s) {
      memory.push_back({i, at, at + held[s] / kGiB, fixed(held[s] / kGiB, 1), s});
      at += held[s] / kGiB;
    }
  }
  return verify::svg_stack(
      {verify::svg_timeline(title + ": predicted step time", rows,
                            {"GEMMs (and recomputation)", "tensor-parallel collectives", "pipeline bubble and sends",
                             "data-parallel exposed"},
                            time, "seconds"),
       verify::svg_timeline(title + ": memory of the fullest GPU", rows,
                            {"parameters", "gradients", "optimizer", "activations", "reserved"}, memory, "GiB")});
}

void explain(const plan::Prediction& p, double hbm) {
  const plan::StepTime& t = p.time;
  const plan::Memory& m = p.memory;
  std::cout << "layout " << p.layout.text() << ": " << p.micro_batches << " micro-batches a step per pipeline\n"
            << "step " << fixed(t.total, 3) << " s = the busiest pipeline rank's passes "
            << fixed(t.compute + t.tp_comm, 3) << " s (GEMMs " << fixed(t.compute, 3) << " s, of which recomputation "
            << fixed(t.recompute, 3) << " s; tensor-parallel collectives " << fixed(t.tp_comm, 3)
            << " s) + pipeline bubble and sends " << fixed(t.pipeline, 3) << " s + data-parallel exposed "
            << fixed(t.dp_exposed, 3) << " s\n"
            << "memory of the fullest GPU " << fixed(m.total() / kGiB, 2) << " GiB of " << fixed(hbm / kGiB, 0)
            << ": parameters " << fixed(m.params / kGiB, 2) << ", gradients " << fixed(m.grads / kGiB, 2)
            << ", optimizer " << fixed(m.optimizer / kGiB, 2) << ", activations " << fixed(m.activations / kGiB, 2)
            << ", reserved " << fixed(m.reserved / kGiB, 2) << "\n"
            << fixed(p.tokens_per_s, 0) << " tokens/s, MFU " << fixed(100 * p.mfu, 1) << "%\n";
}

}  // namespace

int cmd_plan(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kPlanUsage;
    return 0;
  }
  const auto model_path = args.take("model"), cluster_path = args.take("cluster"), batch = args.take("global-batch");
  LS_REQUIRE(model_path && cluster_path && batch, "lockstep plan: --model, --cluster and --global-batch are required\n",
             kPlanUsage);
  const auto seq_len = args.take("seq-len");
  const std::string precision = args.take_or("precision", "bf16");
  const int64_t top = parse_count("lockstep plan", "top", args.take_or("top", "10"));
  const std::string json_path = args.take_or("json", ""), svg_path = args.take_or("svg", "");
  const std::string explain_text = args.take_or("explain", "");
  args.finish("plan");
  LS_REQUIRE(args.positionals().empty(), "lockstep plan: unexpected argument '", args.positionals()[0], "'");
  LS_REQUIRE(precision == "fp32" || precision == "bf16" || precision == "fp8",
             "lockstep plan: --precision: expected fp32, bf16 or fp8, got '", precision, "'");

  std::vector<std::pair<std::string, std::string>> overrides;
  if (seq_len) overrides.emplace_back("model.seq_len", *seq_len);
  const RunConfig run = load_run_config(*model_path, overrides, ConfigUse::kBench);
  plan::PlanRequest request{.model = describe_model(run.model),
                            .global_batch = parse_count("lockstep plan", "global-batch", *batch),
                            .precision = precision_from_name(precision),
                            .source = *model_path};
  LS_REQUIRE(request.global_batch >= 1, "lockstep plan: --global-batch must be >= 1");
  const plan::Cluster cluster = plan::load_cluster(*cluster_path);
  plan::Planner planner(request, cluster);
  double params = 0;
  for (const ParamDecl* p : model_params(request.model)) params += static_cast<double>(param_numel(*p));
  // The trainer's checkpoint: fp32 parameters and AdamW's two moments.
  const auto goodput_of = [&](const plan::Prediction& p) { return plan::goodput(12 * params, p.time.total, cluster); };
  const auto print_goodput = [&](const plan::Prediction& p) {
    const plan::Goodput g = goodput_of(p);
    std::cout << "goodput: the job fails every " << fixed(g.mtbf_s / 60, 1) << " min (" << cluster.mtbf_gpu_hours
              << " GPU-hours each over " << cluster.gpus() << " GPUs); a checkpoint of "
              << fixed(g.checkpoint_bytes / kGiB, 1) << " GiB takes " << fixed(g.save_s, 1) << " s, every "
              << g.interval_steps << " steps (" << fixed(g.interval_s / 60, 1) << " min); " << fixed(100 * g.fraction, 1)
              << "% of the time trains: " << fixed(p.tokens_per_s * g.fraction, 0) << " tokens/s\n";
  };
  std::cout << "plan: " << *model_path << " (" << fixed(params / 1e9, 2) << "B parameters, " << run.model.n_layers
            << " layers, d_model " << run.model.d_model << ") on " << cluster.name << " (" << cluster.gpus()
            << " GPUs, " << cluster.nodes << " x " << cluster.gpus_per_node << ", " << fixed(cluster.hbm_bytes / kGiB, 0)
            << " GiB): " << request.global_batch << " x " << run.model.seq_len << " tokens a step, " << precision << "\n";

  if (!explain_text.empty()) {
    const plan::Layout layout = plan::parse_layout(explain_text, "lockstep plan: --explain");
    const plan::Problem why = planner.problem(layout);
    LS_REQUIRE(why.empty(), "lockstep plan: ", layout.text(), ": ", why.text);
    const plan::Prediction p = planner.predict(layout);
    explain(p, cluster.hbm_bytes);
    print_goodput(p);
    if (const plan::Problem over = planner.fits(p); !over.empty()) std::cout << "does not fit: " << over.text << "\n";
    return 0;
  }

  const plan::SearchResult result = planner.search();
  if (result.ranked.empty()) {
    LS_REQUIRE(!result.any_predicted, "lockstep plan: no layout of ", *model_path, " fits ", cluster.name,
               ": the one that needs least memory (", result.least_memory.layout.text(), ") needs ",
               fixed(result.least_memory.memory.total() / kGiB, 1), " GiB a GPU, ",
               fixed((result.least_memory.memory.total() - cluster.hbm_bytes) / kGiB, 1), " GiB over its ",
               fixed(cluster.hbm_bytes / kGiB, 0), " GiB");
    std::string reasons;
    for (const auto& [kind, r] : result.rejected) {
      reasons += str_cat(reasons.empty() ? "" : "; ", kind, " ", r.count, " (e.g. ", r.example.text(), ": ", r.text, ")");
    }
    throw ConfigError(str_cat("lockstep plan: no layout of ", *model_path, " runs on ", cluster.name, ": ", reasons));
  }
  std::cout << std::left << std::setw(5) << "rank" << std::setw(46) << "layout" << std::right << std::setw(9)
            << "step s" << std::setw(12) << "tokens/s" << std::setw(7) << "MFU" << std::setw(10) << "GEMMs s"
            << std::setw(9) << "tp s" << std::setw(11) << "pipeline s" << std::setw(8) << "dp s" << std::setw(12)
            << "memory GiB" << "\n";
  const int64_t shown = std::min<int64_t>(top, static_cast<int64_t>(result.ranked.size()));
  for (int64_t i = 0; i < shown; ++i) {
    const plan::Prediction& p = result.ranked[static_cast<size_t>(i)];
    std::cout << std::left << std::setw(5) << i + 1 << std::setw(46) << p.layout.text() << std::right << std::setw(9)
              << fixed(p.time.total, 3) << std::setw(12) << fixed(p.tokens_per_s, 0) << std::setw(6)
              << fixed(100 * p.mfu, 1) << "%" << std::setw(10) << fixed(p.time.compute, 3) << std::setw(9)
              << fixed(p.time.tp_comm, 3) << std::setw(11) << fixed(p.time.pipeline, 3) << std::setw(8)
              << fixed(p.time.dp_exposed, 3) << std::setw(12) << fixed(p.memory.total() / kGiB, 1) << "\n";
  }
  print_goodput(result.ranked.front());
  std::cout << "considered " << result.considered << " layouts: " << result.ranked.size() << " fit";
  for (const auto& [kind, r] : result.rejected) {
    std::cout << "; " << kind << " " << r.count << " (e.g. " << r.example.text() << ": " << r.text << ")";
  }
  std::cout << "\n";
  if (!svg_path.empty()) {
    const std::vector<plan::Prediction> best(result.ranked.begin(), result.ranked.begin() + shown);
    std::ofstream out(svg_path);
    LS_REQUIRE(out.good(), "lockstep plan: cannot write ", svg_path);
    out << plan_svg(best, str_cat(run.model.n_layers, " layers, d_model ", run.model.d_model, " on ", cluster.name));
  }
  if (!json_path.empty()) {
    const plan::Goodput g = goodput_of(result.ranked.front());
    nlohmann::json j = {{"model", *model_path}, {"cluster", cluster.name}, {"precision", precision},
                        {"global_batch", request.global_batch}, {"seq_len", run.model.seq_len},
                        {"considered", result.considered},
                        {"goodput", {{"checkpoint_gib", g.checkpoint_bytes / kGiB}, {"save_s", g.save_s},
                                     {"mtbf_s", g.mtbf_s}, {"interval_steps", g.interval_steps},
                                     {"fraction", g.fraction}}}};
    j["ranked"] = nlohmann::json::array();
    for (const plan::Prediction& p : result.ranked) j["ranked"].push_back(to_json(p));
    for (const auto& [kind, r] : result.rejected) {
      j["rejected"][kind] = {{"count", r.count}, {"example", r.example.text()}, {"reason", r.text}};
    }
    std::ofstream out(json_path);
    LS_REQUIRE(out.good(), "lockstep plan: cannot write ", json_path);
    out << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace lockstep::cli
