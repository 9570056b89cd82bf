#include "src/train/campaign_recorder.hpp"

#include "src/train/replay.hpp"
#include "verify/detect/agreed.hpp"

namespace lockstep {

CampaignRecorder::CampaignRecorder(TrainRun& run, std::vector<Injection> faults, const Injector& injector,
                                   const std::string& out)
    : run_(run), faults_(std::move(faults)), injector_(injector) {
  if (run_.world.rank() == 0) out_ = MetricsWriter(out, false);
}

void CampaignRecorder::on_finding(const detect::Finding& f) {
  if (f.detector == "campaign") return;
  if (pending_ < 0 || replaying_) {
    // A spike on a clean step is the training's own (a warning about its dynamics), not a detector
    // that fired without a fault.
    const bool spike = f.detector == "spike";
    if (out_.enabled()) {
      out_.write({{spike ? "spike" : "false_alarm", {{"step", f.step}, {"detector", f.detector}, {"site", f.site}}}});
    }
    return;
  }
  if (detector_.empty()) {
    detector_ = f.detector;
    found_at_ = f.step;
  }
}

void CampaignRecorder::begin_step(int64_t step) {
  judge(step);
  if (pending_ < 0 && next_ < faults_.size() && faults_[next_].step == step) {
    pending_ = static_cast<int64_t>(next_++);
    detector_.clear();
    found_at_ = -1;
  }
}

void CampaignRecorder::end_step(const StepRecord& r) {
  if (r.last) judge(r.step + 1);
}

void CampaignRecorder::judge(int64_t next_step) {
  if (pending_ < 0) return;
  const Injection& f = faults_[static_cast<size_t>(pending_)];
  if (next_step != f.step + 1) return;  // its step has not ended yet (or runs again)
  nlohmann::json rec = {{"fault", pending_}, {"step", f.step}, {"rank", f.rank}, {"site", f.site},
                        {"bit", f.bit}, {"index", f.index}};
  if (!detector_.empty()) {
    rec["detected"] = true;
    rec["detector"] = detector_;
    rec["latency"] = found_at_ - 1 - f.step;
  } else if (!replaying_) {
    const uint64_t mine = injector_.applied(static_cast<size_t>(pending_)) ? 1 : 0;
    bool applied = false;
    for (uint64_t a : detect::agreed_all_gather(run_.world, std::span<const uint64_t>(&mine, 1))) applied |= a != 0;
    if (!applied) {
      rec["applied"] = false;
      if (out_.enabled()) out_.write(rec);
      pending_ = -1;
      return;
    }
    // Undetected: run the step again without it, from its snapshot, and compare what each ended on.
    faulty_hash_ = state_hash(run_);
    replaying_ = true;
    throw detect::FaultRollback({.step = f.step + 1, .detector = "campaign",
                                 .site = "a clean run of the step of an undetected fault"});
  } else {
    const uint64_t differs = state_hash(run_) != faulty_hash_ ? 1 : 0;
    bool changed = false;
    for (uint64_t d : detect::agreed_all_gather(run_.world, std::span<const uint64_t>(&differs, 1))) changed |= d != 0;
    rec["detected"] = false;
    rec["changed"] = changed;
    replaying_ = false;
  }
  if (out_.enabled()) out_.write(rec);
  pending_ = -1;
}

}  // namespace lockstep
