// `lockstep train --config FILE [--section.key=value ...]`
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/train/config.hpp"
#include "src/train/trainer.hpp"

namespace lockstep::cli {

int cmd_train(Args& args) {
  if (args.take_flag("help")) {
    std::cout << "usage: lockstep train --config FILE [--section.key=value ...]\n"
                 "  sections: model data train checkpoint log eval (see scripts/configs/tiny.toml)\n"
                 "  a run with a [checkpoint] dir resumes from its newest valid checkpoint\n"
                 "  --train.stop_after=S ends the run after 0-based step S as its last step (checkpoint,\n"
                 "    metrics), with the LR schedule of all [train] steps; without it the run continues\n";
    return 0;
  }
  if (comm::MpiRuntime::standing_by()) {
    // A spare of `lockstep launch --spares`: it joins MPI's start and end, and nothing between.
    comm::MpiRuntime mpi;
    return 0;
  }
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "lockstep train: --config FILE is required");
  const auto overrides = args.take_dotted();
  args.finish("train");
  LS_REQUIRE(args.positionals().empty(), "lockstep train: unexpected argument '", args.positionals()[0], "'");
  const RunConfig cfg = load_run_config(*config, overrides);
  const TrainSummary s = train(cfg, std::cout);
  return s.exit_status;
}

}  // namespace lockstep::cli
