// `lockstep faultcampaign --config FILE [--np N] [--faults N] [--out DIR] [--section.key=value ...]`:
// plants N faults in one training run and reports what the detectors caught (verify/faultcampaign.hpp).
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/child_process.hpp"
#include "verify/faultcampaign.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kCampaignUsage =
    "usage: lockstep faultcampaign --config FILE [options] [--section.key=value ...]\n"
    "  plans N single-bit faults over every kind of site (GEMM products, messages, parameters and\n"
    "  moments at rest, activations and gradients between ops), runs one `lockstep train` with them\n"
    "  (every detector on, on_fault = rollback: each fault meets a clean state), and reports per site\n"
    "  and bit range what was detected, benign or missed, and the false alarms over the clean steps.\n"
    "  Writes OUT/campaign.json, OUT/campaign.md, OUT/campaign.svg, OUT/faults.jsonl, OUT/records.jsonl.\n"
    "  Exit 0: nothing missed at an every-step site (and every persistent fault named with its rank),\n"
    "  1: faults missed or false alarms, 2: bad input.\n"
    "options:\n"
    "  --np=N              ranks (the run's dp x tp; default 1)\n"
    "  --faults=N          faults to plant (default 100)\n"
    "  --every=K           steps per fault; the others are clean (default 2)\n"
    "  --replay-every=R    the run's [verify] replay_every (default 2; 0: no replay)\n"
    "  --persistent=P      P more runs, one persistent fault each (an activation on one rank),\n"
    "                      found by buddy replay (needs dp >= 2; default 0)\n"
    "  --buddy-every=K     their [verify] buddy_every (default 2)\n"
    "  --seed=S            of the plan (default 1)\n"
    "  --out=DIR           (default faultcampaign-out)\n"
    "  --launcher='WORDS'  command before the executable for N > 1 ranks, {np} = N\n"
    "                      (default 'mpirun --oversubscribe -np {np}')\n";

int64_t number(Args& args, const std::string& key, const std::string& fallback) {
  return parse_count("faultcampaign", key, args.take_or(key, fallback));
}

}  // namespace

int cmd_faultcampaign(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kCampaignUsage;
    return 0;
  }
  verify::CampaignOptions opt;
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "faultcampaign: --config FILE is required (see lockstep faultcampaign --help)");
  opt.config = *config;
  opt.np = number(args, "np", "1");
  opt.faults = number(args, "faults", "100");
  opt.every = number(args, "every", "2");
  opt.replay_every = number(args, "replay-every", "2");
  opt.persistent = number(args, "persistent", "0");
  opt.buddy_every = number(args, "buddy-every", "2");
  opt.seed = static_cast<uint64_t>(number(args, "seed", "1"));
  opt.out = args.take_or("out", "faultcampaign-out");
  opt.launcher = args.take_or("launcher", opt.launcher);
  opt.overrides = args.take_dotted();
  args.finish("faultcampaign");
  LS_REQUIRE(args.positionals().empty(), "faultcampaign: unexpected argument '",
             args.positionals().empty() ? "" : args.positionals()[0], "'");
  LS_REQUIRE(opt.np >= 1, "faultcampaign: --np must be >= 1");
  const nlohmann::json s = verify::run_campaign(opt, std::cout);
  std::cout << "faultcampaign: report " << opt.out << "/campaign.md, " << opt.out << "/campaign.json, " << opt.out
            << "/campaign.svg\n";
  const bool persistent_found =
      !s.contains("persistent") || s["persistent"]["rank_named"] == s["persistent"]["injected"];
  return s["totals"]["missed"].get<int64_t>() == 0 && s["false_alarms"].get<int64_t>() == 0 && persistent_found ? 0 : 1;
}

}  // namespace lockstep::cli
