// `lockstep bench --config FILE [--json FILE] [--tokens-out FILE] [--bench.steps=N] [--bench.warmup=K]
//  [--section.key=value ...]`
#include <fstream>
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/train/bench.hpp"
#include "src/train/config.hpp"

namespace lockstep::cli {

namespace {

int64_t parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LS_REQUIRE(used == text.size() && v >= 0, "--", option, ": expected a non-negative integer, got '", text, "'");
  return v;
}

}  // namespace

int cmd_bench(Args& args) {
  if (args.take_flag("help")) {
    std::cout << "usage: lockstep bench --config FILE [--json FILE] [--tokens-out FILE] [--bench.steps=N]\n"
                 "                      [--bench.warmup=K] [--section.key=value ...]\n"
                 "  times the training step of the config's model (mode and threads from [train]):\n"
                 "  K warm-up steps (default 2), then N timed steps (default 10); prints median and spread\n"
                 "  of step time, tokens/s, FLOP/s (6*N + 12*L*d_model*seq_len per token), MFU against an\n"
                 "  sgemm peak measured in the same process, phases and peak memory; --json writes them.\n"
                 "  Without [data] train the tokens are synthetic (uniform over the vocabulary, fixed seed).\n"
                 "  --tokens-out FILE writes every step's batch: int32, (steps, 2, batch, seq_len), inputs\n"
                 "  then targets; the JSON has each step's loss and learning rate (losses, lrs).\n";
    return 0;
  }
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "lockstep bench: --config FILE is required");
  const auto json_path = args.take("json");
  BenchOptions opt;
  if (auto v = args.take("tokens-out")) opt.tokens_out = *v;
  if (auto v = args.take("bench.steps")) opt.steps = parse_count("bench.steps", *v);
  if (auto v = args.take("bench.warmup")) opt.warmup = parse_count("bench.warmup", *v);
  const auto overrides = args.take_dotted();
  args.finish("bench");
  LS_REQUIRE(args.positionals().empty(), "lockstep bench: unexpected argument '", args.positionals()[0], "'");
  const RunConfig cfg = load_run_config(*config, overrides, ConfigUse::kBench);
  const BenchResult r = run_bench(cfg, opt, std::cout);
  if (json_path) {
    std::ofstream f(*json_path);
    LS_REQUIRE(f.is_open(), "--json: cannot open '", *json_path, "' for writing");
    f << r.to_json(cfg).dump(2) << '\n';
    LS_REQUIRE(f.good(), "--json: write to '", *json_path, "' failed");
    std::cout << "wrote " << *json_path << "\n";
  }
  return 0;
}

}  // namespace lockstep::cli
