// `lockstep plan --cluster local --validate`: the planner's predictions checked against this
// machine. Each layout the planner ranks on the local cluster (src/plan/local_cluster.hpp) runs as
// `lockstep train` under the launcher for a few steps, one thread a rank, on the config's data; its
// step time is the median of the steps after the first two, its memory the fullest rank's peak
// resident memory over the steps (the metrics' last record); both are set beside the prediction
// made from passes timed just before the run, with the error, and a layout's row is its median
// round (validate_layouts).
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
  int64_t rounds = 3;   // runs of every layout, each after its passes are timed again
  std::string launcher = "mpirun --oversubscribe -np {np}";
  std::string bin;    // lockstep executable (default: this one)
  std::string out;    // where the runs write (a directory per layout)
  // The largest message a layout's collectives send (its gradients' fp32 bytes): the collectives
  // timed beside a layout's passes stop at it.
  double largest_message_bytes = 4.0 * plan::kMaxCollectiveFloats;
};

// ConfigError naming the option that is out of range.
void check_options(const ValidateOptions& opt);

// `lockstep bench --collectives` over opt.ranks ranks, its report read back: every size, or for
// `layout` (its report beside the layout's passes) those up to opt.largest_message_bytes with
// fewer repeats.
plan::CollectiveBench run_collective_bench(const ValidateOptions& opt, const plan::Layout* layout = nullptr);
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
  // Each round's step-time error, in the order the rounds ran (validate_layouts' rows).
  std::vector<double> round_step_errors;
  double step_error() const { return (predicted.time.total - measured.step_s) / measured.step_s; }
  double memory_error() const { return (predicted.memory.total() - measured.peak_bytes) / measured.peak_bytes; }
};

// An error as a signed percentage with one decimal: "+3.1%", "-12.0%".
std::string signed_percent(double error);

// A layout's row from its rounds, each a prediction beside the run it was made for: the round
// of the median step-time error (the lower of the middle two for an even count), with the largest
// peak memory of all rounds and every round's step-time error.
Validation median_round(const std::vector<Validation>& rounds);

// A layout's prediction from the collectives timed just before its run — none for a layout of one
// rank, which exchanges nothing — by a planner reading the profile validate_layouts fills.
using PredictFromLinks = std::function<plan::Prediction(const plan::Layout&, const plan::CollectiveBench* links)>;

// Every layout in turn, opt.rounds times: its passes timed again (the shapes it needs, into
// `profile`), then the collectives (run_collective_bench of the layout, where it has more than
// one rank), the layout predicted from both at once (`predict`), then run (a line
// per run to `progress`). A shared machine's speed drifts between states that last seconds to
// minutes — its collectives' by half from one timing to the next — so a prediction is only set
// beside the run it was timed for, and each layout's row is its median round (median_round): a
// state change between one round's timings and its run is outvoted by the other rounds instead
// of deciding the row.
std::vector<Validation> validate_layouts(const ValidateOptions& opt, const std::vector<plan::Layout>& layouts,
                                         plan::ComputeProfile& profile, const PredictFromLinks& predict,
                                         std::ostream& progress);

}  // namespace lockstep::verify
