// The non-finite monitor (always on): a NaN or infinite loss or global gradient norm after a step
// is a finding of class "numeric" (the values are the worst of any rank's, so every rank finds
// alike; the finding names the ranks whose own were not finite, where the others' were).
#pragma once

#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

class NonFiniteDetector final : public StepObserver {
 public:
  NonFiniteDetector(FindingLog& log, FaultAction action) : log_(log), action_(action) {}
  void end_step(const StepRecord& r) override;

 private:
  FindingLog& log_;
  FaultAction action_;
};

}  // namespace lockstep::detect
