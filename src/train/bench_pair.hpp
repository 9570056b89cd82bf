// Two settings of one model timed against each other in one process (`lockstep bench --config FILE
// --bench.against=KEY=VALUE[,KEY=VALUE...]`): the run's config and a baseline that differs from it
// by the overrides, each with its own model and optimizer on the same backend, threads and
// batches, their steps alternating (the run first in even steps, the baseline first in odd ones).
// Each step's ratio, the baseline's time over the run's, is taken from neighbouring steps, so a
// shared machine's slow phases, seconds long, move both and leave the ratio; separate processes
// minutes apart see different machines. What may differ is what a model and its optimizer hold
// (precision, mode, recomputation, micro-batches, the model's shape): the backend's settings
// (threads, ISA, GEMM choice, kernel cache) and the batch (batch size, sequence length, data) are
// the run's, so that the ratio is one of throughput.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/bench.hpp"
#include "src/train/config.hpp"

namespace lockstep {

struct PairedBench {
  std::string against;        // the baseline's overrides, as given
  BenchStats run_ms, baseline_ms;  // their timed steps
  BenchStats speedup;         // per step: baseline time / run time
  int64_t steps = 0;
  nlohmann::json to_json() const;
};

// The baseline's overrides from `flag`'s KEY=VALUE[,KEY=VALUE...]; ConfigError naming the item that
// is not one, or the key that would change the backend or the batch (see above).
std::vector<std::pair<std::string, std::string>> parse_against(const std::string& text, const std::string& flag);

PairedBench run_paired_bench(const RunConfig& run, const RunConfig& baseline, const std::string& against,
                             BenchOptions opt, std::ostream& out);

}  // namespace lockstep
