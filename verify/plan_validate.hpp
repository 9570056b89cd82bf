// `lockstep plan --cluster local --validate`: the planner's predictions checked against this
// machine. Each layout the planner ranks on the local cluster (src/plan/local_cluster.hpp) runs as
// `lockstep train` under the launcher for a few steps, one thread a rank, on the config's data; its
// step time is the median of the steps after the first two (of its fastest round), its memory the
// fullest rank's peak resident memory (the metrics' last record); both are set beside the
// prediction with the error.
// The cost model's inputs come from other measurements, run here under the launcher — the
// collective benchmark (`lockstep bench --collectives`) and a rank's passes (`lockstep bench
// --passes`, src/plan/compute_profile.hpp) — never from these runs.
#pragma once

#include <cstdint>
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
// `lockstep bench --passes` of the config over opt.ranks ranks.
plan::ComputeProfile run_pass_profile(const ValidateOptions& opt);

struct Measurement {
  plan::Layout layout;
  double step_s = 0;      // the median step of its fastest round
  double peak_bytes = 0;  // the fullest rank's
  // The share of the machine's CPU time the hypervisor gave to others during that run (/proc/stat
  // steal): what a shared machine took from the measurement.
  double steal = 0;
};

// Runs one layout and measures it; DataError naming the layout and the run's log when it fails.
Measurement measure_layout(const ValidateOptions& opt, const plan::Layout& layout);

// Every layout, opt.rounds times in turn; before each round after the first the passes are
// timed again and `profile` keeps each shape's fastest (a shared machine's busy moments slow a
// whole stretch of runs: the rounds set the profile and the runs at several moments, and each
// keeps its least disturbed). A line per run to `progress`.
std::vector<Measurement> measure_layouts(const ValidateOptions& opt, const std::vector<plan::Layout>& layouts,
                                         plan::ComputeProfile& profile, std::ostream& progress);

}  // namespace lockstep::verify
