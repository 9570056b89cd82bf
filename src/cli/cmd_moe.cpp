// `lockstep moe report METRICS.jsonl [--out FILE.svg] [--ep N]`: how a MoE run's routing went
// (verify/moe_report.hpp): per layer the load at the start and end, drops, balancing loss, entropy
// and the experts' shares; with --out an SVG of the load and drops over the steps and the least
// balanced layer's experts.
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "verify/moe_report.hpp"

namespace lockstep::cli {

int cmd_moe(Args& args) {
  const auto& pos = args.positionals();
  LS_REQUIRE(pos.size() == 2 && pos[0] == "report",
             "usage: lockstep moe report METRICS.jsonl [--out FILE.svg] [--ep N]\n"
             "  reads the moe records of a run's metrics (per-expert counts every step) and prints each MoE\n"
             "  layer's load, drops, balancing loss and router entropy; --out also draws them; --ep N also\n"
             "  the busiest of N expert-parallel ranks' load (lockstep plan --moe-load)\n");
  const auto out = args.take("out");
  const int64_t ep = parse_count("lockstep moe report", "ep", args.take_or("ep", "1"));
  LS_REQUIRE(ep >= 1, "lockstep moe report: --ep: expected at least one rank, got 0");
  args.finish("moe report");
  const verify::MoeReport report = verify::read_moe_report(pos[1]);
  verify::print_moe_report(report, std::cout, ep);
  if (out) {
    durable_io::write_file_atomic(*out, verify::moe_report_svg(report));
    std::cout << "plot " << *out << "\n";
  }
  return 0;
}

}  // namespace lockstep::cli
