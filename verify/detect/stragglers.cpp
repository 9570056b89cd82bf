#include "verify/detect/stragglers.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "src/core/check.hpp"

namespace lockstep::detect {

StragglerDetector::StragglerDetector(StragglerRule rule, comm::Communicator& world, FindingLog& log,
                                     FaultAction action)
    : rule_(rule), world_(world), log_(log), action_(action), slow_windows_(static_cast<size_t>(world.size()), 0) {
  LS_REQUIRE(action != FaultAction::kRollback, "[verify] on_straggler: a slow rank is not undone by a rollback");
  LS_REQUIRE(rule.window >= 1 && rule.threshold > 1 && rule.patience >= 1,
             "[verify] straggler_window >= 1, straggler_threshold > 1 and straggler_patience >= 1 are required, got ",
             rule.window, ", ", rule.threshold, ", ", rule.patience);
}

void StragglerDetector::rolled_back(int64_t) {
  compute_ = 0;
  steps_ = 0;
}

void StragglerDetector::end_step(const StepRecord& r) {
  if (steps_ == 0) first_step_ = r.done();
  compute_ += std::max(0.0, r.seconds - r.wait_seconds);
  if (++steps_ < rule_.window) return;
  const std::vector<double> all = world_.all_gather(compute_ / static_cast<double>(steps_));
  const int64_t first = first_step_, last = r.done();
  compute_ = 0;
  steps_ = 0;
  std::vector<double> sorted = all;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (median <= 0) return;
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const double ratio = all[rank] / median;
    slow_windows_[rank] = ratio > rule_.threshold ? slow_windows_[rank] + 1 : 0;
    if (slow_windows_[rank] != rule_.patience) continue;  // reported once per slow spell
    std::ostringstream detail;
    detail << std::setprecision(3) << "compute " << all[rank] << " s a step against the median rank's " << median
           << " s over steps " << first << "-" << last << ", " << rule_.patience << " windows of " << rule_.window
           << " steps in a row";
    Finding f;
    f.step = r.done();
    f.ranks = {static_cast<int>(rank)};
    f.detector = "straggler";
    f.site = "step compute time";
    f.magnitude = ratio;
    f.bound = rule_.threshold;
    f.unit = "times the median rank";
    f.classification = "slow rank";
    f.detail = detail.str();
    log_.report(f, FaultAction::kWarn, kExitSlowRank, "[verify] on_straggler");
    if (action_ == FaultAction::kStop) stop_requested_ = true;
  }
}

}  // namespace lockstep::detect
