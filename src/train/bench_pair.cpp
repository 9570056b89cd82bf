#include "src/train/bench_pair.hpp"

#include <array>
#include <iomanip>
#include <string_view>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"

namespace lockstep {

namespace {

// Keys the baseline may not change: the backend's and the batch's (bench_pair.hpp).
constexpr std::array<std::string_view, 9> kShared = {"train.threads",     "train.isa",      "train.fast_gemm",
                                                     "train.kernel_cache", "train.batch_size", "train.seed",
                                                     "model.seq_len",     "model.vocab_size", "data.train"};

ModelOptions options(Backend& backend, const TrainConfig& tc) {
  ModelOptions o;
  o.backend = &backend;
  o.precision = tc.precision_recipe();
  return o;
}

Model& initialised(Model& model) {
  model.init_parameters();
  return model;
}

// One side of the comparison: a model and its optimizer on the shared backend.
struct Side {
  Side(const RunConfig& cfg, Backend& backend, int64_t steps)
      : tc(cfg.train),
        model(cfg.model, tc.mode, tc.micro_batch(), options(backend, tc)),
        adamw(initialised(model), tc.adamw()),
        schedule{tc.lr, tc.min_lr, tc.warmup, steps} {}
  const TrainConfig& tc;
  Model model;
  AdamW adamw;
  LrSchedule schedule;
  std::vector<double> ms;

  void step(const BenchBatches& batch, int64_t step, bool timed, comm::Communicator& self) {
    const StepTimes t = timed_step(model, adamw, tc, batch, static_cast<float>(schedule.at(step)), step, self);
    if (timed) ms.push_back(t.forward_backward_ms + t.optimizer_ms);
  }
};

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_against(const std::string& text, const std::string& flag) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string_view item : split_commas(text)) {
    const size_t eq = item.find('=');
    LS_REQUIRE(eq != std::string::npos && eq > 0 && item.find('.') < eq && eq + 1 < item.size(), flag,
               ": expected KEY=VALUE[,KEY=VALUE...] with KEY a section.key (train.precision=fp32), got '", item, "'");
    const std::string key(item.substr(0, eq));
    for (std::string_view shared : kShared) {
      LS_REQUIRE(key != shared, flag, ": ", key,
                 " is the run's (the backend, the batch and the data are shared by both sides; "
                 "time another ", key, " with a bench of its own)");
    }
    out.emplace_back(key, item.substr(eq + 1));
  }
  return out;
}

nlohmann::json PairedBench::to_json() const {
  return {{"against", against},
          {"steps", steps},
          {"run_step_ms", stats_json(run_ms)},
          {"baseline_step_ms", stats_json(baseline_ms)},
          {"speedup", stats_json(speedup)},
          {"speedup_note", "per step: the baseline's step time over the run's, the two steps timed one after the other"}};
}

PairedBench run_paired_bench(const RunConfig& run, const RunConfig& baseline, const std::string& against,
                             BenchOptions opt, std::ostream& out) {
  check_options(opt);
  const TrainConfig& tc = run.train;
  CpuBackend backend({tc.threads, tc.isa, tc.fast_gemm});
  // The GEMMs run_bench would choose: measured, unless [train] peak_gflops is configured.
  if (tc.peak_gflops <= 0) backend.choose_gemms(backend.measure_gemm_peak());
  comm::SelfCommunicator self;
  BenchBatches batch(run);
  Side a(run, backend, opt.warmup + opt.steps), b(baseline, backend, opt.warmup + opt.steps);
  out << "bench: " << run.source << " against " << against << ": " << opt.warmup << " warm-up + " << opt.steps
      << " timed steps each, alternating, the step alone (no [verify] detectors); " << backend.threads() << " threads, " << backend.isa_name() << "; batch "
      << tc.batch_size << " x " << run.model.seq_len << " tokens; "
      << (batch.synthetic() ? "synthetic uniform tokens" : "tokens from " + run.data.train) << "\n"
      << "  this run: " << mode_name(tc.mode) << " mode, " << tc.precision_recipe().describe() << "\n"
      << "  baseline: " << mode_name(baseline.train.mode) << " mode, " << baseline.train.precision_recipe().describe()
      << "\n"
      << "  kernels: fast mode's GEMM " << backend.fast_gemm_name() << ", bf16 products " << backend.bf16_kernel_name()
      << "\n";
  for (int64_t step = 0; step < opt.warmup + opt.steps; ++step) {
    batch.next();
    const bool timed = step >= opt.warmup;
    // Which side goes first alternates, so that neither always runs after the other's caches.
    Side& first = step % 2 == 0 ? a : b;
    Side& second = step % 2 == 0 ? b : a;
    first.step(batch, step, timed, self);
    second.step(batch, step, timed, self);
  }
  PairedBench r;
  r.against = against;
  r.steps = opt.steps;
  std::vector<double> ratios;
  for (size_t i = 0; i < a.ms.size(); ++i) ratios.push_back(b.ms[i] / a.ms[i]);
  r.run_ms = stats_of(a.ms);
  r.baseline_ms = stats_of(b.ms);
  r.speedup = stats_of(ratios);
  print_stats(out, "step, this run", r.run_ms, 34);
  print_stats(out, "step, baseline", r.baseline_ms, 34);
  print_stats(out, "baseline / this run, step by step", r.speedup, 34, "x ");
  out << "this run is " << std::setprecision(3) << r.speedup.median << "x as fast as the baseline (" << against
      << "): the median of " << r.steps << " paired steps\n";
  return r;
}

}  // namespace lockstep
