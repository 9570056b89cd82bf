// `lockstep bisect --a='ARGS' --b='ARGS' --steps=N [...]`: the first step and op at which two
// training runs diverge (verify/bisect.hpp). Exit status: 0 no divergence, 1 divergence found
// (step, and op when the dumps name one), 2 bad input or a side that fails to run.
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "verify/bisect.hpp"
#include "src/core/child_process.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kBisectUsage =
    "usage: lockstep bisect --a='TRAIN ARGS' --b='TRAIN ARGS' --steps=N [options]\n"
    "  runs `lockstep train` with each side's arguments (quoted like a shell command line, e.g.\n"
    "  --a='--config c.toml' --b='--config c.toml --train.mode=fast'), finds the first step whose\n"
    "  loss or resulting state (model hash, AdamW moments, sampler) differs, re-runs that step on\n"
    "  both sides with every tensor dumped and names the first op whose inputs agree while its\n"
    "  output does not. Writes OUT/bisect-report.md and OUT/bisect.json. Give --a and --b with '='\n"
    "  (a value that starts with -- is not read from the next argument).\n"
    "  Exit 0: no divergence, 1: divergence found, 2: bad input or a side failed to run\n"
    "options:\n"
    "  --steps=N           the run's [train] steps (bisect sets it on both sides)\n"
    "  --out=DIR           work directory for checkpoints, dumps, logs, report (default bisect-out)\n"
    "  --every=K           scan checkpoint interval (default round(sqrt(N)))\n"
    "  --bounds            ops agree when each side is within its op-local derived bound (lockstep\n"
    "                      diff --bounds) instead of bitwise: names the first op outside its bound\n"
    "  --a-bin=PATH        executable for side A (default: this lockstep); --b-bin likewise\n"
    "  --a-np=N            run side A on N ranks under the launcher; --b-np likewise\n"
    "  --launcher='WORDS'  command before the executable for N > 1 ranks, {np} = N\n"
    "                      (default 'mpirun --oversubscribe -np {np}')\n";

verify::BisectSide side(Args& args, const std::string& key, const std::string& label) {
  verify::BisectSide s;
  s.label = label;
  const auto text = args.take(key);
  LS_REQUIRE(text.has_value(), "bisect: --", key, "='TRAIN ARGS' is required (e.g. --", key,
             "='--config c.toml'; see lockstep bisect --help)");
  s.args = verify::split_shell_words(*text, "--" + key);
  s.bin = args.take_or(key + "-bin", current_executable());
  const std::string np = args.take_or(key + "-np", "1");
  LS_REQUIRE(!np.empty() && np.find_first_not_of("0123456789") == std::string::npos && std::stoll(np) >= 1,
             "bisect: --", key, "-np expects a rank count >= 1, got '", np, "'");
  s.np = std::stoll(np);
  return s;
}

}  // namespace

int cmd_bisect(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kBisectUsage;
    return 0;
  }
  verify::BisectOptions opt;
  opt.a = side(args, "a", "A");
  opt.b = side(args, "b", "B");
  const auto steps = args.take("steps");
  LS_REQUIRE(steps.has_value(), "bisect: --steps=N is required (the run's [train] steps; see lockstep bisect --help)");
  opt.steps = parse_count("bisect", "steps", *steps);
  opt.every = parse_count("bisect", "every", args.take_or("every", "0"));
  opt.out = args.take_or("out", "bisect-out");
  opt.bounds = args.take_flag("bounds");
  opt.launcher = args.take_or("launcher", "mpirun --oversubscribe -np {np}");
  args.finish("bisect");
  LS_REQUIRE(args.positionals().empty(), "bisect: unexpected argument '",
             args.positionals().empty() ? "" : args.positionals()[0], "' (see lockstep bisect --help)");
  const verify::BisectResult r = verify::bisect(opt, std::cerr);
  r.print_summary(std::cout);
  std::cout << "bisect: report " << opt.out << "/bisect-report.md\n";
  return r.diverged ? 1 : 0;
}

}  // namespace lockstep::cli
