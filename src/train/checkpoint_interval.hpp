// How often to checkpoint: the interval that loses the least time to saves and to the work a
// failure throws away, from the save's cost δ (the stall it costs the step), the job's mean time
// between failures M and the step time. Young (CACM 17(9), 1974) gave the first-order optimum
// √(2δM); Daly (Future Generation Computer Systems 22(3), 2006) the higher-order one used here:
//   τ = √(2δM)·(1 + ⅓·√(δ/2M) + ⅑·(δ/2M)) − δ   for δ < 2M,   τ = M otherwise,
// τ counted in compute time between saves.
// Not here: measuring δ and the step (src/train/checkpointing.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lockstep {

inline double daly_interval_s(double save_s, double mtbf_s) {
  if (save_s >= 2 * mtbf_s) return mtbf_s;
  const double r = save_s / (2 * mtbf_s);
  return std::sqrt(2 * save_s * mtbf_s) * (1 + std::sqrt(r) / 3 + r / 9) - save_s;
}

// Steps between checkpoints: τ over the step time, rounded, at least 1.
inline int64_t checkpoint_interval_steps(double save_s, double mtbf_s, double step_s) {
  const double steps = daly_interval_s(save_s, mtbf_s) / std::max(step_s, 1e-9);
  return std::max<int64_t>(1, std::llround(std::min(steps, 1e15)));
}

}  // namespace lockstep
