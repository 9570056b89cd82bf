// `lockstep diff A B [--json FILE] [--mode=exact|ulp:N]`: compares two tensor dumps written by
// `lockstep train --dump.dir` (verify/diff.hpp). Exit status: 0 when every common tensor agrees,
// 1 when one does not (or none are in common), 2 on bad input (a missing or corrupt manifest or
// .npy file is named). --bounds checks op-local derived bounds instead (verify/op_bounds.hpp).
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "verify/diff.hpp"
#include "verify/diff_plot.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kDiffUsage =
    "usage: lockstep diff A B [--json FILE] [--mode=exact|ulp:N] [--bounds --ckpt-a=DIR --ckpt-b=DIR]\n"
    "                   [--plot DIR]\n"
    "  compares the tensors of two dump directories (lockstep train --dump.dir) in execution\n"
    "  order: bitwise equality, max abs/rel error, max ulp distance, mismatching elements and\n"
    "  the first mismatch; names the first divergent tensor. Exit 0: agree, 1: differ, 2: bad input\n"
    "options:\n"
    "  --mode=exact      an element mismatches when its bits differ (default)\n"
    "  --mode=ulp:N      an element mismatches when the values are more than N ulps apart\n"
    "  --bounds          an element mismatches when either side lies outside its op-local bound:\n"
    "                    the exact op on that side's own dumped inputs, plus what any fp32 kernel\n"
    "                    may add whatever its summation order (a Bounded<double> reference step per\n"
    "                    side and dumped step; slow for large models). Steps after 0 need the\n"
    "                    checkpoints they started from: --ckpt-a/--ckpt-b DIR holding step_<N>\n"
    "                    (step 0 starts from the config's initial state). Reports A/bound, B/bound, |A-B| over\n"
    "                    boundA + boundB + |exactA - exactB| per tensor\n"
    "  --json FILE       also write the report as JSON\n"
    "  --plot DIR        also write DIR/error_vs_step.svg (max relative error per step and tensor\n"
    "                    group) and DIR/layer_heatmap.svg (per layer and tensor kind, at the first\n"
    "                    divergent step)\n";

}  // namespace

int cmd_diff(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kDiffUsage;
    return 0;
  }
  const auto mode = verify::DiffMode::parse(args.take_or("mode", "exact"), "--mode");
  const auto json = args.take("json");
  const bool bounds = args.take_flag("bounds");
  const auto plot = args.take("plot");
  verify::BoundsInputs inputs{args.take_or("ckpt-a", ""), args.take_or("ckpt-b", "")};
  args.finish("diff");
  LS_REQUIRE(args.positionals().size() == 2, "diff: expected two dump directories, got ",
             args.positionals().size(), " arguments\n", kDiffUsage);
  LS_REQUIRE(bounds || (inputs.ckpt_a.empty() && inputs.ckpt_b.empty()), "diff: --ckpt-a/--ckpt-b only go with --bounds");
  const verify::DiffReport report =
      verify::diff_dumps(args.positionals()[0], args.positionals()[1], mode, bounds ? &inputs : nullptr);
  report.print(std::cout);
  if (json) durable_io::write_file_atomic(*json, report.to_json().dump(1) + "\n");
  if (plot) {
    for (const auto& f : verify::write_diff_plots(report, *plot)) std::cout << "plot " << f << "\n";
  }
  return report.agree() ? 0 : 1;
}

}  // namespace lockstep::cli
