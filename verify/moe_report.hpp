// `lockstep moe report`: how a MoE run's routing went, from its metrics JSONL
// (src/train/moe_statistics.hpp's "moe" records): per layer the load (the most chosen expert over
// the mean) at the start and end of the run and its worst, the dropped share of the choices, the
// balancing loss and the router's entropy, each expert's share of the choices over the last tenth of
// the steps; and an SVG of the load and the drops of every layer over the steps, with the least
// balanced layer's experts' shares over the steps as a heat map. Under expert parallelism over ep
// ranks (rank r holds experts [r·E/ep, (r+1)·E/ep)), the busiest rank's load: the step waits at
// each MoE layer for the rank with the most routed rows, so its load is the sum over the layers of
// the busiest rank's rows over the sum of the mean rank's — what `lockstep plan --moe-load` takes.
// Not here: the statistics (src/train/moe_statistics.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace lockstep::verify {

struct MoeLayerSeries {
  std::vector<double> step, load, dropped, aux_loss, entropy;
  std::vector<std::vector<double>> routed;  // per step, per expert
};

struct MoeReport {
  std::map<std::string, MoeLayerSeries> layers;  // "layer/0/moe" -> its series
};

// Throws DataError naming the file and line of a malformed record, and when the file holds no MoE
// record.
MoeReport read_moe_report(const std::string& metrics_path);
// ep > 1: also the busiest expert-parallel rank's load (ConfigError where ep does not divide the
// experts).
void print_moe_report(const MoeReport& r, std::ostream& out, int64_t ep = 1);
// That load at each step.
std::vector<double> busiest_rank_load(const MoeReport& r, int64_t ep);
std::string moe_report_svg(const MoeReport& r);

}  // namespace lockstep::verify
