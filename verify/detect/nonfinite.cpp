#include "verify/detect/nonfinite.hpp"

#include <cmath>
#include <limits>

namespace lockstep::detect {

void NonFiniteDetector::end_step(const StepRecord& r) {
  for (const auto& [site, x] : {std::pair{"loss", r.loss}, std::pair{"grad_norm", r.grad_norm}}) {
    if (std::isfinite(x)) continue;
    log_.report({.step = r.done(), .ranks = r.nonfinite_ranks, .detector = "nonfinite", .site = site, .magnitude = x,
                 .bound = std::numeric_limits<float>::max(), .unit = "value", .classification = "numeric",
                 .detail = "the step's reduced value is not finite"},
                action_, kExitNumeric, "on_fault");
    return;  // one finding per step: a NaN loss makes a NaN norm
  }
}

}  // namespace lockstep::detect
