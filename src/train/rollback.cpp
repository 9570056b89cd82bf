#include "src/train/rollback.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace lockstep {

void copy_state(std::span<const float> from, std::vector<float>& to) {
  constexpr int64_t kBlock = int64_t{1} << 18;
  to.resize(from.size());
  const auto n = static_cast<int64_t>(from.size());
#pragma omp parallel for schedule(static) if (n > kBlock)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    const int64_t first = b * kBlock, end = std::min(n, first + kBlock);
    std::copy(from.begin() + first, from.begin() + end, to.begin() + first);
  }
}

void StepState::take(const TrainRun& run, const std::vector<StepObserver*>& observers) {
  copy_state(run.held_params(), params_);
  copy_state(run.ddp.moments_m(), m_);
  copy_state(run.ddp.moments_v(), v_);
  sampler_ = run.sampler.state();
  histories_ = nlohmann::json::object();
  for (const StepObserver* o : observers) {
    if (!o->state_key().empty()) histories_[o->state_key()] = o->save_state();
  }
}

void StepState::put_back(TrainRun& run, const std::vector<StepObserver*>& observers, int64_t step) const {
  std::copy(params_.begin(), params_.end(), run.held_params().begin());
  run.held_params_written();
  std::copy(m_.begin(), m_.end(), run.ddp.moments_m().begin());
  std::copy(v_.begin(), v_.end(), run.ddp.moments_v().begin());
  run.sampler.restore(sampler_);
  for (StepObserver* o : observers) {
    if (!o->state_key().empty() && histories_.contains(o->state_key())) o->restore_state(histories_[o->state_key()]);
    o->rolled_back(step);
  }
}

void StepSnapshots::begin_step(int64_t step) {
  if (step == step_) return;  // a replay: the snapshot is this step's already
  step_ = step;
  replays_ = 0;
  before_.take(run_, observers_);
}

int64_t StepSnapshots::restore(const detect::FaultRollback& rollback) {
  const detect::Finding& f = rollback.finding();
  LS_CHECK(step_ >= 0, "a rollback before the first snapshot");
  if (replays_ >= max_replays_) {
    detect::stop_persistent(str_cat("step ", step_, " met the ", f.detector, " finding at ", f.site, " again in each of ",
                                     replays_, " replays from its snapshot"),
                            f.ranks);
  }
  ++replays_;
  ++rollbacks_;
  put_back();
  run_.out << "rolled back to step " << step_ << " (its in-memory snapshot; replay " << replays_ << " of at most "
           << max_replays_ << ") on the " << f.detector << " finding at " << f.site << "\n";
  return step_;
}

void StepSnapshots::put_back() {
  LS_CHECK(step_ >= 0, "no snapshot to put back");
  before_.put_back(run_, observers_, step_);
}

}  // namespace lockstep
