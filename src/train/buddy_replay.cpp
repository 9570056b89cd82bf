#include "src/train/buddy_replay.hpp"

#include <algorithm>
#include <span>

#include "verify/detect/agreed.hpp"

namespace lockstep {

void BuddyReplay::begin_step(int64_t step) {
  if (due(step)) witness_.start();
}

void BuddyReplay::after_reduce(int64_t, float) {
  if (witness_.collecting()) own_ = witness_.stop();
}

std::vector<std::vector<uint64_t>> BuddyReplay::gather(std::vector<uint64_t> mine) const {
  comm::Communicator& world = run_.world;
  const uint64_t length = mine.size();
  uint64_t longest = 0;
  for (uint64_t n : detect::agreed_all_gather(world, std::span<const uint64_t>(&length, 1))) longest = std::max(longest, n);
  mine.resize(longest, 0);
  const std::vector<uint64_t> all = detect::agreed_all_gather(world, mine);
  std::vector<std::vector<uint64_t>> by_rank(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < by_rank.size(); ++r) {
    by_rank[r].assign(all.begin() + static_cast<std::ptrdiff_t>(r * longest),
                      all.begin() + static_cast<std::ptrdiff_t>((r + 1) * longest));
  }
  return by_rank;
}

void BuddyReplay::pin(int64_t step, const std::function<void(int64_t, bool)>& run_again) {
  snapshots_.put_back();
  witness_.start();
  run_again(run_.dp.rank(), false);
  own_ = witness_.stop();
  check(step, run_again);
}

void BuddyReplay::check(int64_t step, const std::function<void(int64_t, bool)>& run_again) {
  const int64_t dp = run_.dp.size(), group = run_.dp.rank();
  detect::BuddyRuns runs{.dp = dp, .tp = run_.tp.size(), .original = gather(std::move(own_)), .buddy = {}, .third = {}};
  after_.take(run_, snapshots_.observers());
  snapshots_.put_back();
  witness_.start();
  run_again((group + dp - 1) % dp, false);
  runs.buddy = gather(witness_.stop());
  ++runs_;
  if (detect::disagreeing_batches(runs).empty()) {
    after_.put_back(run_, snapshots_.observers(), step);
    return;
  }
  snapshots_.put_back();
  witness_.start();
  run_again(group, true);
  runs.third = gather(witness_.stop());
  ++runs_;
  const detect::BuddyVerdict v = detect::judge_buddies(runs);
  using Kind = detect::BuddyVerdict::Kind;
  // The third run's state is the right one when it corrected the step's own run; otherwise the
  // step's own run's is (a fault that every run meets stops the run, or warns about a state that
  // no run computed right).
  if (v.kind != Kind::kOriginalHit) after_.put_back(run_, snapshots_.observers(), step);
  if (v.kind == Kind::kAgree) return;
  const bool persistent = v.kind == Kind::kPersistent;
  // What hit the step once is corrected already (no rollback needed); a fault that every run meets
  // stops, named, unless the user said "warn".
  const bool stop = persistent && action_ != detect::FaultAction::kWarn;
  const detect::FaultAction action = detect::replayed_action(action_, persistent);
  log_.report({.step = step + 1, .ranks = v.ranks, .detector = "buddy",
               .site = v.tensor < witness_.size()
                           ? str_cat(witness_.name(v.tensor), " (tensor ", v.tensor, " of the ", witness_.size(),
                                     " the step's micro-batches showed, forward and backward)")
                           : std::string("the step's tensors"),
               .magnitude = static_cast<double>(v.ranks.size()), .bound = 0, .unit = "ranks",
               .classification = persistent ? (v.pinned ? "persistent" : "persistent, one of the ranks") : "transient",
               .detail = v.detail},
              action, detect::kExitCorruption, "on_fault");
  if (stop) {
    detect::stop_persistent(str_cat("step ", step, " computed its batches differently than their buddies in every run ",
                                    v.pinned ? "(buddy replay)" : "(buddy replay; one of the ranks is faulty)"),
                            v.ranks);
  }
}

}  // namespace lockstep
