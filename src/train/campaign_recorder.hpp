// A fault campaign's bookkeeping inside the run it drives (`lockstep faultcampaign`,
// verify/faultcampaign.hpp): the run trains with [inject] campaign's faults, one a step at most, and
// rolls back on findings; for each fault this observer writes one JSON line (world rank 0) saying
// whether a detector found it — which one, and how many steps after its own (0: in its step, or
// before the next one's forward) — and, if none did, what it did: the step then runs again from
// its snapshot without the fault (a forced rollback) and the ranks compare the state each run ended
// on (parameters and moments), so every fault meets a clean state and its effect is its own. A
// fault whose site the step never reached (a message that did not come) is recorded as not applied.
// A finding while no fault is pending is a false alarm, recorded as such (a loss or gradient-norm
// spike then is the training's own, recorded apart).
// Not here: the faults themselves (inject.hpp), the campaign's plan and report (verify/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/train/inject.hpp"
#include "src/train/metrics.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep {

class CampaignRecorder final : public StepObserver {
 public:
  // faults: the run's schedule, planted by `injector`; out: the records (written by world rank 0).
  CampaignRecorder(TrainRun& run, std::vector<Injection> faults, const Injector& injector, const std::string& out);
  // Every finding of the run (FindingLog::listen).
  void on_finding(const detect::Finding& f);
  // Judges the previous step's fault; place it after the state-at-rest check and before the snapshot.
  void begin_step(int64_t step) override;
  // The run's last step judges its own fault (no next step will).
  void end_step(const StepRecord& r) override;

 private:
  void judge(int64_t next_step);

  TrainRun& run_;
  std::vector<Injection> faults_;
  const Injector& injector_;
  MetricsWriter out_;           // one line a fault, flushed as it goes
  size_t next_ = 0;             // the next fault of the schedule
  int64_t pending_ = -1;        // the fault in flight (index), -1: none
  std::string detector_;        // of the first finding while pending ("": none)
  int64_t found_at_ = -1;       // that finding's step (steps done)
  bool replaying_ = false;      // the undetected fault's clean replay is running
  uint64_t faulty_hash_ = 0;    // the state the faulty run ended on
};

}  // namespace lockstep
