// `lockstep plan --model FILE --cluster FILE|local [--global-batch B] [--seq-len T] [--precision P]
// [--top N] [--json FILE] [--svg FILE] [--explain LAYOUT] [--validate ...] [--section.key=value ...]`:
// the layouts of a run on a cluster, ranked by the planner's predicted step time
// (src/plan/planner.hpp), each with its time and memory broken down (as bars in the SVG), and every
// rejected layout counted by its reason; or one layout's prediction in full. `--cluster local`
// measures this machine (src/plan/local_cluster.hpp); `--validate` then runs every layout that
// fits and sets the measured step time and memory beside the prediction (verify/plan_validate.hpp).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "src/cli/commands.hpp"
#include "src/cli/plan_output.hpp"
#include "src/core/check.hpp"
#include "src/core/parse_number.hpp"
#include "src/plan/goodput.hpp"
#include "src/plan/local_cluster.hpp"
#include "src/plan/planner.hpp"
#include "src/train/config.hpp"
#include "verify/plan_validate.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kPlanUsage =
    "usage: lockstep plan --model FILE.toml --cluster FILE.toml|local [--global-batch B] [--seq-len T]\n"
    "                     [--nodes N] [--precision fp32|bf16|fp8] [--moe-load L] [--top N] [--json FILE]\n"
    "                     [--svg FILE] [--explain LAYOUT]\n"
    "                     [--validate [--ranks N] [--steps S] [--rounds R] [--layouts 'L1,L2'] [--launcher WORDS]\n"
    "                     [--out DIR]] [--section.key=value ...]\n"
    "  ranks the layouts the trainer runs (dp x tp x pp x cp x ep of the cluster's GPUs, micro-batch,\n"
    "  ZeRO 0-3, sequence parallelism, recomputation, 1F1B, zero-bubble or interleaved schedule) by\n"
    "  predicted step time and prints the best N (default 10) with time and memory broken down (--svg:\n"
    "  as bars), and the rejected layouts by reason.\n"
    "  --model: a run config (its [model], [train] mode, batch_size and precision, [parallel] bucket_mb);\n"
    "  --global-batch and --precision override its batch and precision; --cluster: scripts/clusters/*.toml,\n"
    "  or local: this machine measured, N ranks of one thread (default: one per core; the all-reduce\n"
    "  and a rank's passes timed by `lockstep bench --collectives` and `--passes` under the launcher).\n"
    "  --nodes N: the cluster file's machine with N nodes.\n"
    "  --moe-load L: a MoE model's busiest expert-parallel rank gets L times its share of the routed\n"
    "  rows (default 1; `lockstep moe report` prints a run's, the busiest expert's over the mean).\n"
    "  --explain 'dp16 tp8 pp8 mb1 zero1 sp 1f1b recompute=selective': one layout in full.\n"
    "  --validate (local): runs each layout that fits (or --layouts) for S steps (default 6) with\n"
    "  `lockstep train`, R rounds (default 3), each run predicted from its passes timed just before\n"
    "  it, and prints predicted against measured step time and peak memory (the median round).\n"
    "  --launcher: words before the executable for more than one rank, {np} the count\n"
    "  (default 'mpirun --oversubscribe -np {np}'); --out: the runs' directory (default plan-validate).\n"
    "  --section.key=value: overrides of the config, also passed to the runs (e.g. --data.train=...).\n";

using plan::kGiB;

// --moe-load: a number of at least 1.
double parse_load(const std::string& text) {
  const std::optional<double> v = parse_number(text);
  LS_REQUIRE(v && *v >= 1 && std::isfinite(*v),
             "lockstep plan: --moe-load: expected a number >= 1 (the busiest expert-parallel rank's routed rows "
             "over the mean), got '", text, "'");
  return *v;
}

// The shown layouts' step time and memory, each a row of stacked bars.
std::string plan_svg(const std::vector<plan::Prediction>& shown, const std::string& title) {
  std::vector<std::string> rows;
  std::vector<verify::TimelineBar> time, memory;
  for (size_t i = 0; i < shown.size(); ++i) {
    const plan::Prediction& p = shown[i];
    rows.push_back(str_cat(i + 1, ". ", p.layout.text()));
    double at = 0;
    const double parts[] = {p.time.compute,    p.time.tp_comm, p.time.cp_comm,  p.time.ep_comm, p.time.pipeline,
                            p.time.dp_exposed, p.time.skew,    p.time.optimizer + p.time.state_at_rest};
    for (size_t s = 0; s < std::size(parts); ++s) {
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
                            {"compute (and recomputation)", "tensor-parallel collectives",
                             "context-parallel gathers and reductions", "expert-parallel exchanges",
                             "pipeline bubble and sends", "data-parallel exposed",
                             "waiting for the slowest rank", "optimizer and state-at-rest hashes"},
                            time, "seconds"),
       verify::svg_timeline(title + ": memory of the fullest GPU", rows,
                            {"parameters", "gradients", "optimizer", "activations", "reserved"}, memory, "GiB")});
}

void explain(const plan::Prediction& p, double hbm) {
  const plan::StepTime& t = p.time;
  const plan::Memory& m = p.memory;
  // GiB, or MiB for a model that needs less than a GiB.
  const auto size = [&](double bytes) {
    return m.total() < kGiB ? fixed(bytes / (1 << 20), 1) + " MiB" : fixed(bytes / kGiB, 2) + " GiB";
  };
  std::cout << "layout " << p.layout.text() << ": " << p.micro_batches << " micro-batches a step per pipeline\n"
            << "step " << fixed(t.total, 3) << " s = the busiest pipeline rank's passes "
            << fixed(t.compute + t.tp_comm + t.cp_comm + t.ep_comm, 3) << " s (compute " << fixed(t.compute, 3)
            << " s, of which recomputation " << fixed(t.recompute, 3) << " s"
            << (t.streaming > 0 ? ", and kernels other than GEMMs " + fixed(t.streaming, 3) + " s, recomputed ones included"
                                : "")
            << "; tensor-parallel collectives "
            << fixed(t.tp_comm, 3) << " s; context-parallel gathers and reductions " << fixed(t.cp_comm, 3)
            << " s; expert-parallel exchanges " << fixed(t.ep_comm, 3) << " s) + pipeline bubble and sends "
            << fixed(t.pipeline, 3) << " s + data-parallel exposed "
            << fixed(t.dp_exposed, 3) << " s"
            << (t.skew > 0 ? " + waiting for the slowest rank at the collectives " + fixed(t.skew, 3) + " s" : "")
            << (t.optimizer > 0 ? " + optimizer " + fixed(t.optimizer, 3) + " s" : "")
            << (t.state_at_rest > 0 ? " + state-at-rest hashes " + fixed(t.state_at_rest, 3) + " s" : "")
            << "\n"
            << "memory of the fullest GPU " << size(m.total()) << " of " << fixed(hbm / kGiB, 0)
            << " GiB: parameters " << size(m.params) << ", gradients " << size(m.grads) << ", optimizer "
            << size(m.optimizer) << ", activations " << size(m.activations) << ", reserved " << size(m.reserved) << "\n"
            << fixed(p.tokens_per_s, 0) << " tokens/s, MFU " << fixed(100 * p.mfu, 1) << "% (HFU "
            << fixed(100 * p.hfu, 1) << "%: the recomputed forwards' FLOPs counted too)\n";
}

}  // namespace

int cmd_plan(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kPlanUsage;
    return 0;
  }
  const auto model_path = args.take("model"), cluster_path = args.take("cluster");
  LS_REQUIRE(model_path && cluster_path, "lockstep plan: --model and --cluster are required\n", kPlanUsage);
  const auto batch = args.take("global-batch"), seq_len = args.take("seq-len");
  const auto precision_arg = args.take("precision");
  const int64_t top = parse_count("lockstep plan", "top", args.take_or("top", "10"));
  const std::string json_path = args.take_or("json", ""), svg_path = args.take_or("svg", "");
  const std::string explain_text = args.take_or("explain", "");
  const bool local = *cluster_path == "local", validate = args.take_flag("validate");
  verify::ValidateOptions vopt;
  vopt.config = *model_path;
  vopt.ranks = parse_count("lockstep plan", "ranks", args.take_or("ranks", std::to_string(plan::online_cores())));
  vopt.steps = parse_count("lockstep plan", "steps", args.take_or("steps", "6"));
  vopt.rounds = parse_count("lockstep plan", "rounds", args.take_or("rounds", "3"));
  vopt.launcher = args.take_or("launcher", vopt.launcher);
  vopt.out = args.take_or("out", "plan-validate");
  const std::string only = args.take_or("layouts", "");
  const auto nodes = args.take("nodes"), moe_load = args.take("moe-load");
  std::vector<std::pair<std::string, std::string>> overrides = args.take_dotted();
  args.finish("plan");
  LS_REQUIRE(args.positionals().empty(), "lockstep plan: unexpected argument '", args.positionals()[0], "'");
  LS_REQUIRE(!precision_arg || *precision_arg == "fp32" || *precision_arg == "bf16" || *precision_arg == "fp8",
             "lockstep plan: --precision: expected fp32, bf16 or fp8, got '", precision_arg.value_or(""), "'");
  LS_REQUIRE(!validate || local, "lockstep plan: --validate runs the layouts here: it needs --cluster local");
  if (local) verify::check_options(vopt);
  LS_REQUIRE(!nodes || !local, "lockstep plan: --nodes sizes a cluster file; the local cluster has --ranks");

  // The batch, the sequence and the precision as the config's overrides, which the local
  // cluster's benchmarks and runs take as well.
  if (seq_len) overrides.emplace_back("model.seq_len", *seq_len);
  if (batch) overrides.emplace_back("train.batch_size", *batch);
  if (precision_arg) overrides.emplace_back("train.precision", *precision_arg);
  vopt.overrides = overrides;
  const RunConfig run = load_run_config(*model_path, overrides, ConfigUse::kBench);
  const std::string precision(precision_name(run.train.precision));
  plan::PlanRequest request{.model = describe_model(run.model),
                            .global_batch = run.train.batch_size,
                            .precision = run.train.precision,
                            .mode = run.train.mode,
                            .exact_reduce = run.parallel.reduce == "exact",
                            .bucket_bytes = run.parallel.bucket_mb * (1 << 20),
                            .state_at_rest = run.verify.state_at_rest,
                            .source = *model_path};
  LS_REQUIRE(request.global_batch >= 1, "lockstep plan: --global-batch must be >= 1");
  if (moe_load) {
    LS_REQUIRE(run.model.moe_experts > 0, "lockstep plan: --moe-load: ", *model_path, " has no mixture-of-experts layers");
    request.moe_load = parse_load(*moe_load);
  }
  // The local cluster: one thread a rank, as its runs train.
  std::optional<plan::ComputeProfile> profile;
  plan::Cluster cluster;
  if (local) {
    profile = verify::run_pass_profile(vopt);
    cluster = plan::local_cluster(verify::run_collective_bench(vopt), *profile, plan::machine_memory_bytes(),
                                  plan::online_cores());
  } else {
    cluster = plan::load_cluster(*cluster_path);
    if (nodes) {
      // The same machine at another size: a published run's share of it.
      cluster.nodes = parse_count("lockstep plan", "nodes", *nodes);
      LS_REQUIRE(cluster.nodes >= 1, "lockstep plan: --nodes must be >= 1");
      cluster.name += str_cat(" at ", cluster.nodes, " nodes");
    }
  }
  plan::Planner planner(request, cluster, profile ? &*profile : nullptr);
  double params = 0;
  for (const ParamDecl* p : model_params(request.model)) params += static_cast<double>(param_numel(*p));
  // The trainer's checkpoint: fp32 parameters and AdamW's two moments.
  const auto goodput_of = [&](const plan::Prediction& p) { return plan::goodput(12 * params, p.time.total, cluster); };
  const auto print_goodput = [&](const plan::Prediction& p) {
    if (cluster.mtbf_gpu_hours <= 0) return;  // the local cluster: not measured
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
            << " GiB): " << request.global_batch << " x " << run.model.seq_len << " tokens a step, " << precision << ", "
            << mode_name(request.mode) << " mode"
            << (request.moe_load != 1 ? ", the busiest expert-parallel rank routed " + fixed(request.moe_load, 2) +
                                            " times its share"
                                      : "")
            << "\n";
  if (local) {
    std::cout << "local: " << cluster.gpus() << " ranks of one thread; GEMM peak " << fixed(cluster.peak_fp32 / 1e9, 1)
              << " GFLOP/s a rank; all-reduce ring fit alpha " << fixed(cluster.intra.latency * 1e6, 1) << " us, beta "
              << fixed(cluster.intra.bandwidth / 1e9, 2) << " GB/s (" << vopt.out << "/collectives.json); "
              << fixed(cluster.reserved_bytes / (1 << 20), 0) << " MiB a rank before its model; communication "
              << (cluster.comm_beside_compute ? "beside the compute (spare cores)" : "on the compute's cores")
              << "; passes timed by lockstep bench --passes (" << vopt.out << "/passes.json)\n";
  }

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
  // GiB to one decimal, or MiB where the best layout needs less than a GiB (the local cluster).
  const std::pair<double, int> unit =
      result.ranked.front().memory.total() < kGiB ? std::make_pair(double{1 << 20}, 0) : std::make_pair(kGiB, 1);
  std::cout << std::left << std::setw(5) << "rank" << std::setw(54) << "layout" << std::right << std::setw(9)
            << "step s" << std::setw(12) << "tokens/s" << std::setw(7) << "MFU" << std::setw(10) << "compute s"
            << std::setw(9) << "tp s" << std::setw(8) << "cp s" << std::setw(8) << "ep s" << std::setw(11)
            << "pipeline s" << std::setw(8)
            << "dp s" << std::setw(8) << "wait s" << std::setw(12)
            << (unit.first == kGiB ? "memory GiB" : "memory MiB") << "\n";
  const int64_t shown = std::min<int64_t>(top, static_cast<int64_t>(result.ranked.size()));
  for (int64_t i = 0; i < shown; ++i) {
    const plan::Prediction& p = result.ranked[static_cast<size_t>(i)];
    std::cout << std::left << std::setw(5) << i + 1 << std::setw(54) << p.layout.text() << std::right << std::setw(9)
              << fixed(p.time.total, 3) << std::setw(12) << fixed(p.tokens_per_s, 0) << std::setw(6)
              << fixed(100 * p.mfu, 1) << "%" << std::setw(10) << fixed(p.time.compute, 3) << std::setw(9)
              << fixed(p.time.tp_comm, 3) << std::setw(8) << fixed(p.time.cp_comm, 3) << std::setw(8)
              << fixed(p.time.ep_comm, 3) << std::setw(11)
              << fixed(p.time.pipeline, 3) << std::setw(8)
              << fixed(p.time.dp_exposed, 3) << std::setw(8) << fixed(p.time.skew, 3) << std::setw(12)
              << fixed(p.memory.total() / unit.first, unit.second) << "\n";
  }
  print_goodput(result.ranked.front());
  std::cout << "considered " << result.considered << " layouts: " << result.ranked.size() << " fit";
  for (const auto& [kind, r] : result.rejected) {
    std::cout << "; " << kind << " " << r.count << " (e.g. " << r.example.text() << ": " << r.text << ")";
  }
  std::cout << "\n";
  nlohmann::json validation;
  if (validate) {
    vopt.largest_message_bytes = 4 * params;  // the gradients, fp32
    validation = validate_plan(vopt, planner, *profile, result.ranked, only);
  }
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
    if (validate) j["validate"] = validation;
    std::ofstream out(json_path);
    LS_REQUIRE(out.good(), "lockstep plan: cannot write ", json_path);
    out << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace lockstep::cli
