#include "src/plan/goodput.hpp"

#include <cmath>

#include "src/train/checkpoint_interval.hpp"

namespace lockstep::plan {

Goodput goodput(double checkpoint_bytes, double step_s, const Cluster& c) {
  Goodput g;
  g.checkpoint_bytes = checkpoint_bytes;
  g.save_s = checkpoint_bytes / c.storage_write;
  g.mtbf_s = c.mtbf_gpu_hours * 3600 / static_cast<double>(c.gpus());
  g.interval_steps = checkpoint_interval_steps(g.save_s, g.mtbf_s, step_s);
  g.interval_s = static_cast<double>(g.interval_steps) * step_s;
  const double M = g.mtbf_s;
  g.fraction = g.interval_s / (M * std::exp(c.restart_s / M) * std::expm1((g.interval_s + g.save_s) / M));
  return g;
}

}  // namespace lockstep::plan
