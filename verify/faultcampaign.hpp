// `lockstep faultcampaign`: measures what the detectors catch instead of claiming it. It plans N
// single-bit faults — random site, bit, element and rank, one in each block of `every` steps at a
// random step of it — over every kind of site the run has:
//   gemm         a linear layer's product as the op leaves it (forward, dinp, dweight)   every step
//   comm         a message as a rank receives it (dp and tp groups)                      every step
//   state        a parameter or AdamW moment between steps                               every step
//   activation   a tensor between ops, forward or backward (no checksum covers it)       interval
// runs one `lockstep train` with them ([inject] campaign; the detectors on, on_fault = rollback,
// every fault judged and rolled back before the next: src/train/campaign_recorder.hpp) and reports,
// per site and bit range: detected (by which detector, how many steps late), benign (undetected
// and within the site's derived bound: the state unchanged, or a product or float sum below its
// checksum's threshold), missed (undetected at an every-step site although the state changed) and,
// at interval sites, the replay's detection rate; and the false alarms over the clean steps.
// Writes OUT/faults.jsonl (the plan), OUT/records.jsonl (the run's), OUT/campaign.json,
// OUT/campaign.md (the table) and OUT/campaign.svg (detection rate by site and bit).
// With `persistent` = P > 0 (and dp >= 2), P more runs each plant one persistent fault — an
// activation on one rank, changed in every run of every step from its own — with buddy replay every
// `buddy_every` steps, and report whether each stopped the run (exit 8) within one interval and
// named its rank (pinned: named alone; with dp = 2 the finding names a pair). A replay on the
// faulty rank meets such a fault again and cannot see it.
// Not here: planting and judging one fault (src/train/inject.hpp, campaign_recorder.hpp).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/config.hpp"

namespace lockstep::verify {

struct CampaignOptions {
  std::string config;                                        // the run's config file
  std::vector<std::pair<std::string, std::string>> overrides;  // --section.key=value for the run
  int64_t np = 1;                // ranks
  int64_t faults = 100;
  int64_t every = 2;             // steps per fault (the others are clean: false alarms)
  int64_t replay_every = 2;      // [verify] replay_every of the run (interval sites)
  int64_t persistent = 0;        // runs with one persistent fault each
  int64_t buddy_every = 2;       // their [verify] buddy_every
  uint64_t seed = 1;
  std::string out = "faultcampaign-out";
  std::string launcher = "mpirun --oversubscribe -np {np}";
  std::string bin;               // lockstep executable (default: this one)
};

// The run's config with the overrides (for the sites and the layout).
RunConfig campaign_run_config(const CampaignOptions& opt);

// N faults as [inject] campaign lines ({"step", "rank", "site", "kind"}), one in each block of
// `every` steps.
std::vector<nlohmann::json> plan_faults(const RunConfig& cfg, const CampaignOptions& opt);

// The site class of a site name: "gemm", "comm", "state" or "activation".
std::string site_class(const std::string& site);

// The summary of the run's records (see the top); `faults` the plan, `steps` the run's.
nlohmann::json summarize_campaign(const std::vector<nlohmann::json>& faults, const std::vector<nlohmann::json>& records,
                                  int64_t steps, const RunConfig& cfg);

// The summary of the persistent runs' records ({"rank", "named", "pinned", "exit", "latency", ...}).
nlohmann::json summarize_persistent(const std::vector<nlohmann::json>& runs, int64_t buddy_every, int64_t dp);

// Plans, runs and reports; progress to `log`. Returns the summary.
nlohmann::json run_campaign(const CampaignOptions& opt, std::ostream& log);

}  // namespace lockstep::verify
