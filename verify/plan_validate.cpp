#include "verify/plan_validate.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/child_process.hpp"
#include "src/core/durable_io.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/train/bench.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::verify {

namespace {

std::string executable(const ValidateOptions& opt) { return opt.bin.empty() ? current_executable() : opt.bin; }

// The run's log's last lines, for an error.
[[noreturn]] void failed(const std::string& what, const std::string& log) {
  throw DataError(str_cat(what, " failed (", log, "):\n", tail_of_file(log, 8)));
}

// The machine's CPU time so far (/proc/stat's first line, in clock ticks): all of it, and stolen.
struct CpuTicks {
  double total = 0, steal = 0;
};
CpuTicks cpu_ticks() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  CpuTicks t;
  stat >> cpu;
  for (int field = 0; field < 8; ++field) {  // user nice system idle iowait irq softirq steal
    double v = 0;
    if (!(stat >> v)) return {};
    t.total += v;
    if (field == 7) t.steal = v;
  }
  return t;
}

// A layout's name as a directory's: "dp2_tp1_pp1_mb4_zero0_recompute-full".
std::string dir_name(const plan::Layout& l) {
  std::string name = l.text();
  std::replace(name.begin(), name.end(), ' ', '_');
  std::replace(name.begin(), name.end(), '=', '-');
  return name;
}

// `lockstep bench ARGS --json=OUT/name.json` under the launcher over opt.ranks ranks; its report.
nlohmann::json run_bench_report(const ValidateOptions& opt, const std::vector<std::string>& args, const std::string& name) {
  const std::string json = opt.out + "/" + name + ".json", log = opt.out + "/" + name + ".log";
  durable_io::make_dirs(std::filesystem::path(json).parent_path().string());
  std::vector<std::string> argv = launcher_words(opt.launcher, opt.ranks, "--launcher");
  argv.insert(argv.end(), {executable(opt), "bench"});
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json=" + json);
  if (run_child(argv, log).status != 0) failed("lockstep bench " + args.front(), log);
  std::ifstream in(json);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(json, ": not JSON (", e.what(), ")"));
  }
}

}  // namespace

plan::CollectiveBench run_collective_bench(const ValidateOptions& opt, const plan::Layout* layout) {
  std::vector<std::string> args = {"--collectives"};
  if (layout != nullptr) {
    // Seconds, not the half minute of every size 20 times: once a round for every layout.
    args.push_back(str_cat("--bench.largest_kib=", std::max<int64_t>(1, std::llround(opt.largest_message_bytes / 1024))));
    args.emplace_back("--bench.repeats=3");
  }
  const std::string name = layout != nullptr ? "collectives/" + dir_name(*layout) : "collectives";
  return plan::collective_bench_from_json(run_bench_report(opt, args, name), opt.out + "/" + name + ".json");
}

plan::ComputeProfile run_pass_profile(const ValidateOptions& opt, const plan::Layout* layout) {
  std::vector<std::string> args = {"--passes", "--config", opt.config};
  for (const auto& [k, v] : opt.overrides) args.push_back("--" + k + "=" + v);
  if (layout != nullptr) {
    // Three shapes only: more passes of each for the same time.
    args.insert(args.end(), {str_cat("--bench.tp=", layout->tp), str_cat("--bench.sp=", layout->sp ? "true" : "false"),
                             str_cat("--bench.cp=", layout->cp),
                             str_cat("--bench.cp_comm=", parallel::cp_comm_name(layout->ring)),
                             str_cat("--bench.micro=", layout->micro_batch),
                             std::string("--bench.repeats=11")});
  }
  // A layout's own shapes beside the other layouts' (not over the whole profile's report).
  const std::string name = layout != nullptr ? "passes/" + dir_name(*layout) : "passes";
  return plan::ComputeProfile::from_json(run_bench_report(opt, args, name), opt.out + "/" + name + ".json");
}

void check_options(const ValidateOptions& opt) {
  LS_REQUIRE(opt.ranks >= 1, "lockstep plan: --ranks must be >= 1");
  LS_REQUIRE(opt.steps >= 3, "lockstep plan: --steps must be >= 3 (the first two are not timed)");
  LS_REQUIRE(opt.rounds >= 1, "lockstep plan: --rounds must be >= 1");
}

Measurement measure_layout(const ValidateOptions& opt, const plan::Layout& l) {
  const std::string dir = opt.out + "/" + dir_name(l), log = dir + "/train.log", metrics = dir + "/metrics.jsonl";
  // No metrics of an earlier run.
  std::filesystem::remove_all(dir);
  durable_io::make_dirs(dir);
  std::vector<std::string> argv = launcher_words(opt.launcher, l.gpus(), "--launcher");
  argv.insert(argv.end(), {executable(opt), "train", "--config", opt.config});
  for (const auto& [k, v] : opt.overrides) argv.push_back("--" + k + "=" + v);
  for (const std::string& a : {
           str_cat("--parallel.dp=", l.dp), str_cat("--parallel.tp=", l.tp), str_cat("--parallel.pp=", l.pp),
           str_cat("--parallel.cp=", l.cp), str_cat("--parallel.cp_comm=", parallel::cp_comm_name(l.ring)),
           str_cat("--parallel.ep=", l.ep),
           str_cat("--parallel.zero=", l.zero), str_cat("--parallel.sp=", l.sp ? "true" : "false"),
           str_cat("--parallel.schedule=", parallel::schedule_name(l.schedule)),
           str_cat("--parallel.virtual_stages=", l.chunks),
           str_cat("--train.micro_batch_size=", l.micro_batch), str_cat("--train.recompute=", recompute_name(l.recompute)),
           std::string("--train.threads=1"), str_cat("--train.steps=", opt.steps),
           // Nothing but the steps and their metrics: no checkpoint (whose copies would add to the
           // peak memory), no evaluation.
           std::string("--checkpoint.dir="),
           std::string("--eval.every=0"), str_cat("--log.metrics=", metrics), std::string("--log.every=1")}) {
    argv.push_back(a);
  }
  const CpuTicks before = cpu_ticks();
  if (run_child(argv, log).status != 0) failed(str_cat("the run of ", l.text()), log);
  const CpuTicks after = cpu_ticks();

  Measurement m;
  m.layout = l;
  if (after.total > before.total) m.steal = (after.steal - before.steal) / (after.total - before.total);
  std::vector<double> steps;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_discarded()) continue;
    if (r.contains("step_ms") && r.at("step").get<int64_t>() > 2) steps.push_back(r.at("step_ms").get<double>() / 1e3);
    if (r.contains("peak_mem_mib_by_rank")) {
      for (double mib : r.at("peak_mem_mib_by_rank")) m.peak_bytes = std::max(m.peak_bytes, mib * (1 << 20));
    }
  }
  if (steps.empty() || m.peak_bytes <= 0) failed(str_cat("reading ", metrics, " of ", l.text()), log);
  m.step_s = stats_of(steps).median;
  return m;
}

std::string signed_percent(double error) {
  std::ostringstream s;
  s << std::showpos << std::fixed << std::setprecision(1) << 100 * error << "%";
  return s.str();
}

Validation median_round(const std::vector<Validation>& rounds) {
  LS_CHECK(!rounds.empty(), "median_round: no rounds");
  std::vector<size_t> order(rounds.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rounds[a].step_error() < rounds[b].step_error(); });
  Validation v = rounds[order[(order.size() - 1) / 2]];
  v.round_step_errors.clear();
  for (const Validation& r : rounds) {
    v.round_step_errors.push_back(r.step_error());
    v.measured.peak_bytes = std::max(v.measured.peak_bytes, r.measured.peak_bytes);
  }
  return v;
}

std::vector<Validation> validate_layouts(const ValidateOptions& opt, const std::vector<plan::Layout>& layouts,
                                         plan::ComputeProfile& profile, const PredictFromLinks& predict,
                                         std::ostream& progress) {
  std::vector<std::vector<Validation>> rounds(layouts.size());
  for (int64_t round = 0; round < opt.rounds; ++round) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      const plan::ComputeProfile fresh = run_pass_profile(opt, &layouts[i]);
      for (const auto& [shape, t] : fresh.times()) profile.set(shape, t);
      std::optional<plan::CollectiveBench> links;
      if (layouts[i].gpus() > 1) links = run_collective_bench(opt, &layouts[i]);
      const Validation v{predict(layouts[i], links ? &*links : nullptr), measure_layout(opt, layouts[i]), {}};
      progress << "  round " << round + 1 << "/" << opt.rounds << ", " << i + 1 << "/" << layouts.size() << ": "
               << v.measured.layout.text() << ": predicted " << std::fixed << std::setprecision(1)
               << v.predicted.time.total * 1e3 << " ms, measured " << v.measured.step_s * 1e3 << " ms ("
               << signed_percent(v.step_error()) << "), " << std::setprecision(0)
               << v.measured.peak_bytes / (1 << 20) << " MiB, " << std::setprecision(1) << 100 * v.measured.steal
               << "% stolen\n"
               << std::flush;
      rounds[i].push_back(v);
    }
  }
  std::vector<Validation> rows;
  for (const std::vector<Validation>& r : rounds) rows.push_back(median_round(r));
  return rows;
}

}  // namespace lockstep::verify
