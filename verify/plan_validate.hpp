// `lockstep plan --cluster local --validate`: the planner's predictions checked against this
// machine. Each layout the planner ranks on the local cluster (src/plan/local_cluster.hpp) runs as
// `lockstep train` under the launcher for a few steps, one thread a rank, on the config's data; its
// step time is the median of the steps after the first two (of its fastest round), its memory the
// fullest rank's peak resident memory over the steps (the metrics' last record); both are set
// beside the prediction made from passes timed just before the run, with the error.
// The cost model's inputs come from other measurements, run here under the launcher — the
// collective benchmark (`lockstep bench --collectives`) and a rank's passes (`lockstep bench
// --passes`, src/plan/compute_profile.hpp) — never from these runs.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "src/plan/collective_bench.hpp"
#include "src/plan/compute_profile.hpp"
#include "src/plan/cost_model.hpp"

namespace lockstep::verify {

struct ValidateOptions {
  std::string config;  // the run config
  // --section.key=value for every run and benchmark (the batch and precision planned among them)
  std::vector<std::pair<std::string, std::string>> overrides;
  int64_t ranks = 2;
  int64_t steps = 6;    // per layout; the first two are not timed
  int64_t rounds = 2;   // runs of every layout, each round after the first profiled again
  std::string launcher = "mpirun --oversubscribe -np {np}";
  std::string bin;    // lockstep executable (default: this one)
  std::string out;    // where the runs write (a directory per layout)
};

// ConfigError naming the option that is out of range.
void check_options(const ValidateOptions& opt);

// `lockstep bench --collectives` over opt.ranks ranks, its report read back.
plan::CollectiveBench run_collective_bench(const ValidateOptions& opt);
// `lockstep bench --passes` of the config over opt.ranks ranks: every shape, or those of `layout`
// (its tp, sequence parallelism and micro-batch, each recomputation).
plan::ComputeProfile run_pass_profile(const ValidateOptions& opt, const plan::Layout* layout = nullptr);

struct Measurement {
  plan::Layout layout;
  double step_s = 0;      // the median step after the first two
  double peak_bytes = 0;  // the fullest rank's
  // The share of the machine's CPU time the hypervisor gave to others during the run (/proc/stat
  // steal): what a shared machine took from the measurement.
  double steal = 0;
};

// Runs one layout and measures it; DataError naming the layout and the run's log when it fails.
Measurement measure_layout(const ValidateOptions& opt, const plan::Layout& layout);

struct Validation {
  plan::Prediction predicted;
  Measurement measured;
  double step_error() const { return (predicted.time.total - measured.step_s) / measured.step_s; }
  double memory_error() const { return (predicted.memory.total() - measured.peak_bytes) / measured.peak_bytes; }
};

// Every layout in turn, opt.rounds times: its passes timed again (the shapes it needs, into
// `profile`), the layout predicted from them at once (`predict`, a planner reading `profile`),
// then run. A shared machine's speed drifts from one minute to the next: each prediction is made
// beside its run (a line per run to `progress`), and each layout keeps its fastest round, predicted
// again at the end from the fastest of its passes' timings.
std::vector<Validation> validate_layouts(const ValidateOptions& opt, const std::vector<plan::Layout>& layouts,
                                         plan::ComputeProfile& profile,
                                         const std::function<plan::Prediction(const plan::Layout&)>& predict,
                                         std::ostream& progress);

}  // namespace lockstep::verify
