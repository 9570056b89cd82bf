// `lockstep launch [--np N [--spares S]] [--max-restarts R] [--backoff S] [--log FILE] -- COMMAND...`:
// supervise a training job (src/train/launch.hpp). With --np the command is run as
// `mpirun -np N COMMAND` (--mpirun-args adds words before COMMAND, e.g. --oversubscribe; --spares S
// starts S processes more, held in reserve); without it, as given (an mpirun or srun line, or
// `lockstep train` alone).
#include <cstring>
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/train/launch.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kLaunchUsage =
    "usage: lockstep launch [--np N [--spares S] [--mpirun-args='WORDS']] [--max-restarts R] [--backoff S]\n"
    "                       [--log FILE]\n"
    "                       -- COMMAND...\n"
    "  runs COMMAND (with --np N: mpirun -np N WORDS COMMAND), passes its output through, and restarts\n"
    "  it when it fails in a way a restart can mend (a rank killed, the watchdog, an MPI error, diverged\n"
    "  replicas): at most R times (default 3), waiting S·2^(k-1) s before restart k (default S = 1);\n"
    "  the job resumes from its newest valid checkpoint. Input errors, internal errors, numeric stops and\n"
    "  persistent faults are not restarted. --log FILE appends a JSONL record per restart. SIGTERM or\n"
    "  SIGINT is passed to the job (which checkpoints and stops) and ends the supervision.\n"
    "  --spares S (with --np N): start N + S processes, N of them the job; a rank the job stops on as\n"
    "  slow ([verify] on_straggler = \"stop\", exit 9) or persistently faulty (exit 8) is restarted on a\n"
    "  spare process, and its own is not used again.\n";

}  // namespace

int cmd_launch(int argc, char** argv) {
  int dash = 2;
  while (dash < argc && std::strcmp(argv[dash], "--") != 0) ++dash;
  Args args(dash, argv, 2);
  if (args.take_flag("help")) {
    std::cout << kLaunchUsage;
    return 0;
  }
  LaunchOptions opt;
  const std::string np = args.take_or("np", "");
  const std::string mpirun_args = args.take_or("mpirun-args", "");
  const std::string spares = args.take_or("spares", "0");
  opt.max_restarts = static_cast<int>(parse_count("lockstep launch", "max-restarts", args.take_or("max-restarts", "3")));
  const std::string backoff = args.take_or("backoff", "1");
  try {
    size_t used = 0;
    opt.backoff_s = std::stod(backoff, &used);
    LS_REQUIRE(used == backoff.size(), "");
  } catch (const std::exception&) {
    throw ConfigError(str_cat("lockstep launch: --backoff expects seconds (a number), got '", backoff, "'"));
  }
  opt.log = args.take_or("log", "");
  args.finish("launch");
  LS_REQUIRE(args.positionals().empty(), "lockstep launch: unexpected '", args.positionals().empty() ? "" : args.positionals()[0],
             "' before -- (the job's command goes after --)");
  LS_REQUIRE(dash < argc - 1, "lockstep launch: no job command (expected: lockstep launch [options] -- COMMAND...)");
  if (!np.empty()) {
    opt.ranks = static_cast<int>(parse_count("lockstep launch", "np", np));
    LS_REQUIRE(opt.ranks >= 1, "lockstep launch: --np expects a number of ranks >= 1, got '", np, "'");
    opt.spares = static_cast<int>(parse_count("lockstep launch", "spares", spares));
    opt.command = {"mpirun", "-np", std::to_string(opt.ranks + opt.spares)};
    if (opt.spares > 0) opt.command.insert(opt.command.end(), {"-x", "LOCKSTEP_ACTIVE_RANKS"});
    for (const std::string& w : verify::split_shell_words(mpirun_args, "--mpirun-args")) opt.command.push_back(w);
  } else {
    LS_REQUIRE(mpirun_args.empty(), "lockstep launch: --mpirun-args needs --np");
    LS_REQUIRE(spares == "0", "lockstep launch: --spares needs --np (the supervisor starts the processes)");
  }
  for (int i = dash + 1; i < argc; ++i) opt.command.push_back(argv[i]);
  return launch(opt, std::cout);
}

}  // namespace lockstep::cli
