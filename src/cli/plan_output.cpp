#include "src/cli/plan_output.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"

namespace lockstep::cli {

using plan::kGiB;

std::string fixed(double x, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << x;
  return s.str();
}

nlohmann::json to_json(const plan::Prediction& p) {
  return {{"layout", p.layout.text()},
          {"step_s", p.time.total},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"hfu", p.hfu},
          {"micro_batches", p.micro_batches},
          {"time_s",
           {{"compute", p.time.compute},
            {"recompute", p.time.recompute},
            {"streaming", p.time.streaming},
            {"tp_comm", p.time.tp_comm},
            {"cp_comm", p.time.cp_comm},
            {"ep_comm", p.time.ep_comm},
            {"pipeline", p.time.pipeline},
            {"dp_exposed", p.time.dp_exposed},
            {"skew", p.time.skew},
            {"optimizer", p.time.optimizer},
            {"state_at_rest", p.time.state_at_rest}}},
          {"memory_gib",
           {{"params", p.memory.params / kGiB},
            {"grads", p.memory.grads / kGiB},
            {"optimizer", p.memory.optimizer / kGiB},
            {"activations", p.memory.activations / kGiB},
            {"reserved", p.memory.reserved / kGiB},
            {"total", p.memory.total() / kGiB}}}};
}

namespace {

// The planner's accuracy the issue asks of it, and a run the hypervisor disturbed.
constexpr double kWithin = 0.15, kDisturbed = 0.05;

// The ring variant of a context-parallel layout (cp_comm = "p2p").
plan::Layout with_ring(plan::Layout l) {
  l.ring = true;
  return l;
}

// The layouts to validate: the ranked ones and, after each context-parallel one, the same layout
// over the ring, which runs wherever the all-gather does (it holds less) though the search ranks
// it only where the all-gather does not fit; or those `only` names, each ranked or the ring
// variant of one ranked.
std::vector<plan::Layout> chosen_layouts(const std::vector<plan::Prediction>& ranked, const std::string& only) {
  std::vector<plan::Layout> chosen;
  if (only.empty()) {
    for (const plan::Prediction& p : ranked) {
      chosen.push_back(p.layout);
      if (p.layout.cp > 1 && !p.layout.ring) chosen.push_back(with_ring(p.layout));
    }
    return chosen;
  }
  for (const std::string_view text : split_commas(only)) {
    const plan::Layout want = plan::parse_layout(std::string(text), "lockstep plan: --layouts");
    const auto it = std::find_if(ranked.begin(), ranked.end(), [&](const plan::Prediction& p) {
      return p.layout.text() == want.text() || (want.ring && with_ring(p.layout).text() == want.text());
    });
    LS_REQUIRE(it != ranked.end(), "lockstep plan: --layouts: ", want.text(),
               " is not a layout that fits here (see the ranking)");
    chosen.push_back(want.ring ? with_ring(it->layout) : it->layout);
  }
  return chosen;
}

// "59 of 63 within 15%, the largest error 19.8% (dp2 tp1 pp1 mb1 zero2)"
template <class Error>
std::string summary(const std::vector<verify::Validation>& rows, Error error) {
  const auto worst = std::max_element(rows.begin(), rows.end(),
                                      [&](const verify::Validation& a, const verify::Validation& b) {
                                        return std::abs(error(a)) < std::abs(error(b));
                                      });
  const auto within = std::count_if(rows.begin(), rows.end(),
                                    [&](const verify::Validation& r) { return std::abs(error(r)) <= kWithin; });
  return str_cat(within, " of ", rows.size(), " within 15%, the largest error ", fixed(100 * error(*worst), 1), "% (",
                 worst->predicted.layout.text(), ")");
}

}  // namespace

nlohmann::json validate_plan(const verify::ValidateOptions& opt, plan::Planner& planner, plan::ComputeProfile& profile,
                             const std::vector<plan::Prediction>& ranked, const std::string& only) {
  const std::vector<plan::Layout> layouts = chosen_layouts(ranked, only);
  std::cout << "validate: " << layouts.size() << " layouts, " << opt.rounds << " rounds of " << opt.steps
            << " steps each, each run after its passes and collectives are timed again, runs in " << opt.out << "\n";
  const std::vector<verify::Validation> rows = verify::validate_layouts(
      opt, layouts, profile,
      [&](const plan::Layout& l, const plan::CollectiveBench* links) {
        if (links != nullptr) planner.set_measured_links(*links);
        return planner.predict(l);
      },
      std::cout);
  std::cout << "validate: predicted (from the passes and collectives timed just before the run) against measured (the median step "
               "after the first two; the fullest rank's peak resident memory of all rounds; the share of the\n"
               "machine's CPU the hypervisor gave to others during that run), of each layout's round with the median "
               "step-time error; every round's error last\n"
            << std::left << std::setw(46) << "layout" << std::right << std::setw(14) << "predicted ms" << std::setw(13)
            << "measured ms" << std::setw(9) << "error" << std::setw(15) << "predicted MiB" << std::setw(14)
            << "measured MiB" << std::setw(9) << "error" << std::setw(9) << "stolen" << "  rounds' step error\n";
  nlohmann::json out = nlohmann::json::array();
  for (const verify::Validation& r : rows) {
    std::cout << std::left << std::setw(46) << r.predicted.layout.text() << std::right << std::setw(14)
              << fixed(r.predicted.time.total * 1e3, 1) << std::setw(13) << fixed(r.measured.step_s * 1e3, 1)
              << std::setw(8) << fixed(100 * r.step_error(), 1) << "%" << std::setw(15)
              << fixed(r.predicted.memory.total() / (1 << 20), 0) << std::setw(14)
              << fixed(r.measured.peak_bytes / (1 << 20), 0) << std::setw(8) << fixed(100 * r.memory_error(), 1)
              << "%" << std::setw(8) << fixed(100 * r.measured.steal, 1) << "% ";
    for (double e : r.round_step_errors) std::cout << " " << verify::signed_percent(e);
    std::cout << "\n";
    out.push_back({{"layout", r.predicted.layout.text()},
                   {"predicted", to_json(r.predicted)},
                   {"measured_step_s", r.measured.step_s},
                   {"measured_peak_bytes", r.measured.peak_bytes},
                   {"steal", r.measured.steal},
                   {"step_error", r.step_error()},
                   {"round_step_errors", r.round_step_errors},
                   {"memory_error", r.memory_error()}});
  }
  if (!rows.empty()) {
    const auto disturbed = std::count_if(rows.begin(), rows.end(),
                                         [](const verify::Validation& r) { return r.measured.steal > kDisturbed; });
    std::cout << "validate: step time " << summary(rows, [](const verify::Validation& r) { return r.step_error(); })
              << "; peak memory " << summary(rows, [](const verify::Validation& r) { return r.memory_error(); })
              << "; "
              << disturbed << " of " << rows.size() << " runs had more than 5% of the CPU stolen by the hypervisor\n";
  }
  return out;
}

}  // namespace lockstep::cli
