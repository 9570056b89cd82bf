#include "src/train/replay.hpp"

#include "src/core/hash.hpp"
#include "src/train/detectors.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/checksum.hpp"

namespace lockstep {

uint64_t state_hash(const TrainRun& run) {
  std::vector<uint64_t> h;
  for (const detect::RestingBuffer& b : resting_state(run.held_params(), run.ddp.moments_m(), run.ddp.moments_v())) {
    h.push_back(detect::block_hash(b.data.data(), b.data.size_bytes()));
  }
  return xxh64(h.data(), h.size() * sizeof(uint64_t));
}

void StepReplay::check(int64_t step, const std::function<void()>& run_again) {
  const uint64_t original = state_hash(run_);
  snapshots_.put_back();
  run_again();
  ++replays_;
  const uint64_t replay = state_hash(run_);
  const uint64_t differs = original != replay ? 1 : 0;
  const std::vector<uint64_t> all = detect::agreed_all_gather(run_.world, std::span<const uint64_t>(&differs, 1));
  std::vector<int> ranks;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] != 0) ranks.push_back(static_cast<int>(r));
  }
  if (ranks.empty()) return;
  // A third run: which of the two does it reproduce?
  snapshots_.put_back();
  run_again();
  ++replays_;
  const uint64_t third = state_hash(run_);
  const uint64_t verdict = third == replay ? 1 : third == original ? 2 : 3;  // 1: original hit, 2: replay hit
  uint64_t worst = 0;
  for (uint64_t v : detect::agreed_all_gather(run_.world, std::span<const uint64_t>(&verdict, 1))) worst = std::max(worst, v);
  const bool persistent = worst == 3;
  // What hit the step once is corrected already (no rollback needed); a fault that every run meets
  // stops, named, unless the user said "warn".
  const bool stop = persistent && action_ != detect::FaultAction::kWarn;
  const detect::FaultAction action = detect::replayed_action(action_, persistent);
  log_.report({.step = step + 1, .ranks = ranks, .detector = "replay", .site = "parameters and moments after the step",
               .magnitude = static_cast<double>(ranks.size()), .bound = 0, .unit = "ranks",
               .classification = persistent ? "persistent" : "transient",
               .detail = persistent ? std::string("three runs of the step from its snapshot ended on three different states")
                         : worst == 1
                             ? std::string("the step's replay and a third run agree, the original run did not (the "
                                           "state is now the third run's)")
                             : std::string("the original run and a third run agree, the replay did not")},
              action, detect::kExitCorruption, "on_fault");
  if (stop) detect::stop_persistent(str_cat("step ", step, " ended on three different states in three runs from its snapshot"), ranks);
}

}  // namespace lockstep
