// `lockstep moe report`: how a MoE run's routing went, from its metrics JSONL
// (src/train/moe_statistics.hpp's "moe" records): per layer the load (the most chosen expert over
// the mean) at the start and end of the run and its worst, the dropped share of the choices, the
// balancing loss and the router's entropy, each expert's share of the choices over the last tenth of
// the steps; and an SVG of the load and the drops of every layer over the steps, with the least
// balanced layer's experts' shares over the steps as a heat map.
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
void print_moe_report(const MoeReport& r, std::ostream& out);
std::string moe_report_svg(const MoeReport& r);

}  // namespace lockstep::verify
