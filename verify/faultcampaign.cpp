#include "verify/faultcampaign.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <map>
#include <random>
#include <sstream>

#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/model/layer_list.hpp"
#include "src/model/param_layout.hpp"
#include "src/core/child_process.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::verify {

namespace {

struct Site {
  std::string name, klass;
  int nths = 1;  // messages of that operation to choose among (comm)
};

std::vector<Site> sites_of(const RunConfig& cfg, int64_t np) {
  std::vector<Site> s;
  auto add = [&s](std::string name, int nths = 1) {
    std::string klass = site_class(name);
    s.push_back({std::move(name), std::move(klass), nths});
  };
  for (const ParamTensor& t : build_param_layout(cfg.model)) {
    const bool linear = t.klass == ParamClass::kMatrix || (t.name == "wte" && cfg.model.tie_embeddings);
    if (linear && t.shape.size() == 2) {
      for (const char* p : {"forward", "dinp", "dweight"}) add(str_cat("gemm/", t.name, "/", p));
    }
    add("param/" + t.name);
  }
  add("optim/m");
  add("optim/v");
  const ParallelConfig& pc = cfg.parallel;
  const bool canonical = cfg.train.mode == Mode::kCanonical;
  if (np > 1 && pc.dp > 1) {
    // The exact reduction's record counts (nth 0) and sums (nth 1); the gathers of the loss, the
    // gradient norm and (ZeRO) the parameters; fast mode's float reduction.
    if (pc.reduce == "exact") add("comm/dp/all_to_allv", 2);
    if (pc.reduce != "exact") add("comm/dp/reduce_scatter");
    add("comm/dp/all_gatherv", 2);
  }
  if (np > 1 && pc.tp > 1) {
    add("comm/tp/all_gatherv");
    add(canonical ? "comm/tp/all_to_allv" : "comm/tp/reduce_scatter");
  }
  for (const LayerDesc& l : describe_model(cfg.model).layers) {
    for (const OpDecl& op : l.ops) {
      if (op.tensor != "loss") add(op.tensor);
    }
  }
  add("optim/grad");
  return s;
}

std::string bit_range(int bit) {
  if (bit == 31) return "sign (31)";
  if (bit >= 23) return "exponent (23-30)";
  if (bit >= 16) return "mantissa high (16-22)";
  return "mantissa low (0-15)";
}

// A comm site whose check is a float sum's bound rather than a hash (fast mode's reductions).
bool float_sum_site(const std::string& site) {
  return site.ends_with("/reduce_scatter") || site.ends_with("/all_reduce");
}

// "detected" | "benign" | "missed" | "undetected" (interval sites) | "not_applied".
std::string outcome(const nlohmann::json& rec) {
  if (!rec.value("applied", true)) return "not_applied";
  if (rec.value("detected", false)) return "detected";
  if (!rec.value("changed", false)) return "benign";
  const std::string site = rec.at("site").get<std::string>(), k = site_class(site);
  if (k == "activation") return "undetected";
  // Below the derived bound of its site: a product or float sum within its checksum's threshold
  // (what the detector not firing means there); elsewhere any change is one the hashes must see.
  if (k == "gemm" || (k == "comm" && float_sum_site(site))) return "benign";
  return "missed";
}

std::string heat_map(const std::vector<std::string>& rows, const std::map<std::string, std::vector<std::pair<int, int>>>& cells) {
  const int cw = 22, ch = 28, left = 110, top = 50;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + 32 * cw + 40 << "\" height=\""
    << top + ch * static_cast<int>(rows.size()) + 70 << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<text x=\"10\" y=\"20\" font-size=\"14\">Detection rate by site and bit position (number: faults "
       "injected; white: none detected, blue: all)</text>\n";
  for (int b = 0; b < 32; ++b) {
    s << "<text x=\"" << left + b * cw + cw / 2 << "\" y=\"" << top - 6 << "\" text-anchor=\"middle\">" << b << "</text>\n";
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const int y = top + static_cast<int>(r) * ch;
    s << "<text x=\"" << left - 6 << "\" y=\"" << y + ch / 2 + 4 << "\" text-anchor=\"end\">" << rows[r] << "</text>\n";
    const auto& row = cells.at(rows[r]);
    for (int b = 0; b < 32; ++b) {
      const auto [found, n] = row[static_cast<size_t>(b)];
      const double rate = n > 0 ? static_cast<double>(found) / n : 0;
      const int shade = static_cast<int>(255 - 200 * rate);
      s << "<rect x=\"" << left + b * cw << "\" y=\"" << y << "\" width=\"" << cw - 1 << "\" height=\"" << ch - 1
        << "\" fill=\"" << (n == 0 ? std::string("#eeeeee") : str_cat("rgb(", shade, ",", shade, ",255)")) << "\"/>\n";
      if (n > 0) {
        s << "<text x=\"" << left + b * cw + cw / 2 << "\" y=\"" << y + ch / 2 + 4 << "\" text-anchor=\"middle\">" << n
          << "</text>\n";
      }
    }
  }
  s << "<text x=\"" << left << "\" y=\"" << top + ch * static_cast<int>(rows.size()) + 30
    << "\">bit position (0: mantissa's last, 23-30: exponent, 31: sign)</text>\n</svg>\n";
  return s.str();
}

// "finding: after step N, detector D, site S, ranks R: ..." lines of a run's log, as
// {"after_step", "detector", "ranks"} (ranks as world ranks; "all": empty).
std::vector<nlohmann::json> findings_in_log(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("finding: after step ")) continue;
    nlohmann::json f;
    f["after_step"] = std::stoll(line.substr(20));
    const size_t d = line.find(", detector "), r = line.find(", ranks ");
    if (d == std::string::npos || r == std::string::npos) continue;
    f["detector"] = line.substr(d + 11, line.find(',', d + 11) - d - 11);
    std::vector<int> ranks;
    std::istringstream words(line.substr(r + 8, line.find(':', r) - r - 8));
    for (std::string w; std::getline(words, w, ',');) {
      if (w != "all") ranks.push_back(std::stoi(w));
    }
    f["ranks"] = ranks;
    out.push_back(f);
  }
  return out;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace

std::string site_class(const std::string& site) {
  if (site.starts_with("gemm/")) return "gemm";
  if (site.starts_with("comm/")) return "comm";
  // The reduced gradient lies in memory between the reduction and the update, as an activation
  // between two ops: no every-step check holds it (replay does).
  if (site == "optim/grad") return "activation";
  if (site.starts_with("param/") || site.starts_with("optim/")) return "state";
  return "activation";
}

RunConfig campaign_run_config(const CampaignOptions& opt) { return load_run_config(opt.config, opt.overrides); }

std::vector<nlohmann::json> plan_faults(const RunConfig& cfg, const CampaignOptions& opt) {
  const std::vector<Site> sites = sites_of(cfg, opt.np);
  std::map<std::string, std::vector<const Site*>> by_class;
  for (const Site& s : sites) by_class[s.klass].push_back(&s);
  std::vector<std::string> classes;
  for (const auto& [k, v] : by_class) classes.push_back(k);
  std::mt19937_64 rng(opt.seed);
  std::vector<nlohmann::json> plan;
  for (int64_t i = 0; i < opt.faults; ++i) {
    // The classes in turn, so that each gets its share; within a class, a site at random.
    const auto& pool = by_class[classes[static_cast<size_t>(i) % classes.size()]];
    const Site& site = *pool[rng() % pool.size()];
    const int bit = static_cast<int>(rng() % 32);
    const auto index = static_cast<int64_t>(rng() % (uint64_t{1} << 31));
    std::string kind = str_cat("bitflip:bit=", bit, ",index=", index);
    if (site.nths > 1) kind += str_cat(",nth=", rng() % static_cast<uint64_t>(site.nths));
    // Fault i lies somewhere in steps [1 + i·every, 1 + (i + 1)·every): uniform against the replay's
    // phase, so that the interval sites' rate is the replay's, not an artefact of the plan.
    const int64_t step = 1 + i * opt.every + static_cast<int64_t>(rng() % static_cast<uint64_t>(opt.every));
    plan.push_back({{"step", step}, {"rank", static_cast<int64_t>(rng() % static_cast<uint64_t>(opt.np))},
                    {"site", site.name}, {"kind", kind}});
  }
  return plan;
}

nlohmann::json summarize_campaign(const std::vector<nlohmann::json>& faults, const std::vector<nlohmann::json>& records,
                                  int64_t steps, const RunConfig& cfg) {
  nlohmann::json totals = {{"injected", 0}, {"detected", 0}, {"benign", 0}, {"missed", 0}, {"not_applied", 0}};
  nlohmann::json interval = {{"injected", 0}, {"detected", 0}, {"benign", 0}, {"undetected", 0}};
  nlohmann::json by_site = nlohmann::json::object(), by_detector = nlohmann::json::object();
  int64_t false_alarms = 0, spikes = 0, max_latency = 0, judged = 0;
  std::vector<nlohmann::json> outcomes;
  for (const nlohmann::json& r : records) {
    if (r.contains("false_alarm")) {
      ++false_alarms;
      continue;
    }
    if (r.contains("spike")) {
      ++spikes;
      continue;
    }
    ++judged;
    const std::string site = r.at("site").get<std::string>(), k = site_class(site), o = outcome(r);
    nlohmann::json rec = r;
    rec["class"] = k;
    rec["outcome"] = o;
    outcomes.push_back(rec);
    if (o == "not_applied") {
      totals["not_applied"] = totals["not_applied"].get<int64_t>() + 1;
      continue;
    }
    nlohmann::json& t = k == "activation" ? interval : totals;
    t["injected"] = t["injected"].get<int64_t>() + 1;
    t[o] = t.value(o, int64_t{0}) + 1;
    nlohmann::json& cell = by_site[k][bit_range(r.at("bit").get<int>())];
    if (cell.is_null()) cell = {{"injected", 0}, {"detected", 0}, {"benign", 0}, {"missed", 0}, {"undetected", 0}};
    cell["injected"] = cell["injected"].get<int64_t>() + 1;
    cell[o] = cell[o].get<int64_t>() + 1;
    if (o == "detected") {
      const std::string d = r.at("detector").get<std::string>();
      by_detector[d] = by_detector.value(d, int64_t{0}) + 1;
      max_latency = std::max(max_latency, r.value("latency", int64_t{0}));
    }
  }
  const int64_t clean_steps = steps - static_cast<int64_t>(faults.size());
  const int64_t ii = interval["injected"].get<int64_t>();
  return {{"records", outcomes},
          {"totals", totals},
          {"interval_sites", interval},
          {"interval_detection_rate", ii > 0 ? interval["detected"].get<double>() / static_cast<double>(ii) : 0.0},
          {"replay_every", cfg.verify.replay_every},
          {"by_site_and_bits", by_site},
          {"by_detector", by_detector},
          {"max_latency_steps", max_latency},
          {"false_alarms", false_alarms},
          {"spike_warnings_on_clean_steps", spikes},
          {"clean_steps", clean_steps},
          {"planned", faults.size()},
          {"judged", judged},
          {"mode", mode_name(cfg.train.mode)},
          {"layout", {{"dp", cfg.parallel.dp}, {"tp", cfg.parallel.tp}, {"sp", cfg.parallel.sp}, {"zero", cfg.parallel.zero}}}};
}

nlohmann::json summarize_persistent(const std::vector<nlohmann::json>& runs, int64_t buddy_every, int64_t dp) {
  int64_t stopped = 0, in_interval = 0, named = 0, pinned = 0;
  for (const nlohmann::json& r : runs) {
    const bool stop = r.at("exit").get<int>() == 8 && r.contains("latency");
    stopped += stop ? 1 : 0;
    in_interval += stop && r.at("latency").get<int64_t>() < buddy_every ? 1 : 0;
    named += stop && r.value("named", false) ? 1 : 0;
    pinned += stop && r.value("pinned", false) ? 1 : 0;
  }
  return {{"injected", runs.size()}, {"stopped_exit_8", stopped}, {"within_one_interval", in_interval},
          {"rank_named", named}, {"pinned_alone", pinned}, {"buddy_every", buddy_every},
          {"pinning", dp >= 3 ? "to the rank (dp >= 3)" : "to a pair of ranks (dp = 2: no third replica)"},
          {"runs", runs}};
}

nlohmann::json run_campaign(const CampaignOptions& opt, std::ostream& log) {
  LS_REQUIRE(opt.faults >= 1, "faultcampaign: --faults (", opt.faults, ") must be >= 1");
  LS_REQUIRE(opt.every >= 1, "faultcampaign: --every (", opt.every, ") must be >= 1");
  LS_REQUIRE(opt.replay_every >= 0, "faultcampaign: --replay-every (", opt.replay_every, ") must be >= 0");
  RunConfig cfg = campaign_run_config(opt);
  if (cfg.parallel.dp == 0 && opt.np % cfg.parallel.tp == 0) cfg.parallel.dp = opt.np / cfg.parallel.tp;  // dp = 0: the rest
  LS_REQUIRE(cfg.parallel.dp * cfg.parallel.tp == opt.np, "faultcampaign: --np (", opt.np,
             ") must be the run's dp x tp (", cfg.parallel.dp, " x ", cfg.parallel.tp, ")");
  LS_REQUIRE(opt.persistent == 0 || cfg.parallel.dp >= 2, "faultcampaign: --persistent (", opt.persistent,
             ") needs dp >= 2: a persistent fault is found by buddy replay, whose buddy is another dp group");
  LS_REQUIRE(opt.buddy_every >= 1, "faultcampaign: --buddy-every (", opt.buddy_every, ") must be >= 1");
  durable_io::make_dirs(opt.out);
  const std::vector<nlohmann::json> plan = plan_faults(cfg, opt);
  std::string plan_text;
  for (const nlohmann::json& f : plan) plan_text += f.dump() + "\n";
  durable_io::write_file_atomic(opt.out + "/faults.jsonl", plan_text);
  const int64_t steps = 2 + opt.faults * opt.every;

  // `lockstep train` under the launcher, with the config and the overrides.
  std::vector<std::string> train = launcher_words(opt.launcher, opt.np, "--launcher");
  train.insert(train.end(), {opt.bin.empty() ? current_executable() : opt.bin, "train", "--config", opt.config});
  for (const auto& [k, v] : opt.overrides) train.push_back("--" + k + "=" + v);
  std::vector<std::string> argv = train;
  for (const std::string& a :
       {str_cat("--train.steps=", steps), std::string("--verify.abft=true"),
        str_cat("--verify.collectives=", opt.np > 1 ? "true" : "false"), std::string("--verify.on_fault=rollback"),
        std::string("--verify.on_spike=warn"), str_cat("--verify.replay_every=", opt.replay_every),
        str_cat("--inject.campaign=", opt.out, "/faults.jsonl"),
        str_cat("--inject.campaign_out=", opt.out, "/records.jsonl"), std::string("--checkpoint.dir="),
        std::string("--log.every=100"), std::string("--eval.every=0")}) {
    argv.push_back(a);
  }
  log << "faultcampaign: " << opt.faults << " faults over " << steps << " steps, " << opt.np << " rank(s), "
      << mode_name(cfg.train.mode) << " mode; " << join_shell_words(argv) << "\n" << std::flush;
  const ChildExit e = run_child(argv, opt.out + "/train.log");
  LS_REQUIRE(e.status == 0, "faultcampaign: the run failed (exit status ", e.status, "); ", opt.out,
             "/train.log says:\n", tail_of_file(opt.out + "/train.log", 12));
  const std::vector<nlohmann::json> records = read_lines(opt.out + "/records.jsonl");
  nlohmann::json summary = summarize_campaign(plan, records, steps, cfg);

  // Persistent faults, one run each: an activation on one rank, from a step within the first
  // interval on, with buddy replay every buddy_every steps.
  std::vector<Site> activations;
  for (const Site& site : sites_of(cfg, opt.np)) {
    // Hook tensors (what buddy replay's witness sees), not the per-token losses, smaller than the
    // index range below, nor the reduced gradient, which no witness holds.
    if (site.klass == "activation" && site.name != "losses" && site.name != "optim/grad") activations.push_back(site);
  }
  std::mt19937_64 rng(opt.seed ^ 0x5bd1e995ULL);
  std::vector<nlohmann::json> persistent_runs;
  for (int64_t i = 0; i < opt.persistent; ++i) {
    const Site& site = activations[rng() % activations.size()];
    const auto rank = static_cast<int64_t>(rng() % static_cast<uint64_t>(opt.np));
    const int64_t step = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(opt.buddy_every));
    const int bit = static_cast<int>(rng() % 32);
    const auto index = static_cast<int64_t>(rng() % 1024);  // within the smallest activation's shard
    std::vector<std::string> a = train;
    for (const std::string& w :
         {str_cat("--train.steps=", step + opt.buddy_every + 1), str_cat("--verify.buddy_every=", opt.buddy_every),
          std::string("--verify.on_fault=rollback"), std::string("--verify.on_spike=warn"),
          str_cat("--inject.site=", site.name), str_cat("--inject.step=", step), str_cat("--inject.rank=", rank),
          str_cat("--inject.kind=bitflip:bit=", bit, ",index=", index), std::string("--inject.persistent=true"),
          std::string("--checkpoint.dir="), std::string("--log.every=100"), std::string("--eval.every=0")}) {
      a.push_back(w);
    }
    const std::string path = str_cat(opt.out, "/persistent_", i, ".log");
    const ChildExit e = run_child(a, path);
    nlohmann::json rec = {{"site", site.name}, {"rank", rank}, {"step", step}, {"bit", bit}, {"index", index},
                          {"exit", e.status}, {"log", path}};
    std::vector<nlohmann::json> found = findings_in_log(path);
    std::erase_if(found, [](const nlohmann::json& f) { return f["detector"] == "spike"; });  // warnings only
    if (!found.empty()) {
      // Found by the first finding; named by the last, the one that stopped the run.
      const nlohmann::json& f = found.back();
      const auto ranks = f["ranks"].get<std::vector<int>>();
      rec["detector"] = f["detector"];
      rec["first_detector"] = found.front()["detector"];
      rec["ranks_named"] = ranks;
      rec["latency"] = found.front()["after_step"].get<int64_t>() - 1 - step;
      rec["named"] = std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
      rec["pinned"] = ranks == std::vector<int>{static_cast<int>(rank)};
    }
    log << "faultcampaign: persistent fault " << i + 1 << " of " << opt.persistent << " at " << site.name << " on rank "
        << rank << " from step " << step << ": exit " << e.status
        << (found.empty() ? std::string(", no finding")
                          : ", found by " + rec["first_detector"].get<std::string>() + ", stopped by " +
                                rec["detector"].get<std::string>() + " naming ranks " + found.back()["ranks"].dump())
        << "\n" << std::flush;
    persistent_runs.push_back(rec);
  }
  if (opt.persistent > 0) summary["persistent"] = summarize_persistent(persistent_runs, opt.buddy_every, cfg.parallel.dp);
  durable_io::write_file_atomic(opt.out + "/campaign.json", summary.dump(1) + "\n");

  // The table and the plot.
  std::ostringstream md;
  md << "# Fault campaign: " << opt.faults << " faults, " << mode_name(cfg.train.mode) << ", dp " << cfg.parallel.dp
     << " x tp " << cfg.parallel.tp << "\n\n| site | bits | injected | detected | benign | missed | undetected (interval) |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const auto& [k, ranges] : summary["by_site_and_bits"].items()) {
    for (const auto& [range, c] : ranges.items()) {
      md << "| " << k << " | " << range << " | " << c["injected"] << " | " << c["detected"] << " | " << c["benign"]
         << " | " << c["missed"] << " | " << c["undetected"] << " |\n";
    }
  }
  const nlohmann::json& t = summary["totals"];
  md << "\nEvery-step sites: " << t["injected"] << " injected, " << t["detected"] << " detected, " << t["benign"]
     << " benign, " << t["missed"] << " missed. Interval sites (replay every " << opt.replay_every << "): "
     << summary["interval_sites"]["injected"] << " injected, " << summary["interval_sites"]["detected"]
     << " detected (rate " << std::setprecision(3) << summary["interval_detection_rate"].get<double>() << "). False alarms: "
     << summary["false_alarms"] << " over " << summary["clean_steps"] << " clean steps. Detectors: "
     << summary["by_detector"].dump() << "; latest detection " << summary["max_latency_steps"] << " step(s) after its fault.\n";
  if (summary.contains("persistent")) {
    const nlohmann::json& p = summary["persistent"];
    md << "Persistent faults (one run each, buddy replay every " << opt.buddy_every << " steps): " << p["injected"]
       << " injected, " << p["stopped_exit_8"] << " stopped the run with exit 8, " << p["within_one_interval"]
       << " within one interval, " << p["rank_named"] << " named their rank, " << p["pinned_alone"]
       << " named it alone (pinning " << p["pinning"].get<std::string>() << ").\n";
  }
  durable_io::write_file_atomic(opt.out + "/campaign.md", md.str());
  std::map<std::string, std::vector<std::pair<int, int>>> cells;
  for (const nlohmann::json& r : summary["records"]) {
    if (r["outcome"] == "not_applied") continue;
    auto& row = cells[r["class"].get<std::string>()];
    row.resize(32);
    auto& [found, n] = row[static_cast<size_t>(r["bit"].get<int>())];
    ++n;
    found += r["outcome"] == "detected" ? 1 : 0;
  }
  std::vector<std::string> rows;
  for (const auto& [k, v] : cells) rows.push_back(k);
  durable_io::write_file_atomic(opt.out + "/campaign.svg", heat_map(rows, cells));
  log << md.str();
  return summary;
}

}  // namespace lockstep::verify
