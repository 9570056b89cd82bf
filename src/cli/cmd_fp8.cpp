// `lockstep fp8 report METRICS.jsonl [--out FILE.svg] [--top N]`: what an fp8 run's statistics and
// sentinel checks say (verify/fp8_report.hpp): the GEMMs whose quantization hurts most, each
// tensor's worst step, the fp8 findings; with --out an SVG of the worst tensors and GEMMs over the
// steps.
#include <fstream>
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "verify/fp8_report.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kFp8Usage =
    "usage: lockstep fp8 report METRICS.jsonl [--out FILE.svg] [--top N]\n"
    "  reads the fp8 records of a run's metrics (per-tensor statistics every step, the sentinel's\n"
    "  shadow checks, its findings) and prints the GEMMs whose quantization hurts most, each tensor's\n"
    "  worst step and the findings; --out also draws them (the N worst, default 6)\n";

}  // namespace

int cmd_fp8(Args& args) {
  const auto& pos = args.positionals();
  LS_REQUIRE(pos.size() == 2 && pos[0] == "report", kFp8Usage);
  const auto out = args.take("out");
  const std::string top_text = args.take_or("top", "6");
  args.finish("fp8 report");
  size_t top = 0;
  try {
    top = std::stoul(top_text);
  } catch (const std::exception&) {
    throw ConfigError(str_cat("lockstep fp8 report: --top expects a positive integer, got '", top_text, "'"));
  }
  LS_REQUIRE(top >= 1, "lockstep fp8 report: --top expects a positive integer, got '", top_text, "'");
  const verify::Fp8Report report = verify::read_fp8_report(pos[1]);
  verify::print_fp8_report(report, top, std::cout);
  if (out) {
    durable_io::write_file_atomic(*out, verify::fp8_report_svg(report, top));
    std::cout << "plot " << *out << "\n";
  }
  return 0;
}

}  // namespace lockstep::cli
