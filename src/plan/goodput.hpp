// Goodput: the share of a job's wall time that trains, given failures of the whole job every
// M = mtbf_gpu_hours / GPUs (exponentially distributed), a restart of R seconds after each, and
// checkpoints of δ seconds every τ seconds of training (Daly's interval for δ and M,
// src/train/checkpoint_interval.hpp). Daly's complete model (Future Generation Computer Systems
// 22(3), 2006) gives the expected wall time of W seconds of training as
//   T(W) = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·W/τ,
// so goodput = τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1)). δ is a synchronous save of the checkpoint's
// bytes at the cluster's storage bandwidth (an asynchronous save stalls less).
#pragma once

#include <cstdint>

#include "src/plan/cluster.hpp"

namespace lockstep::plan {

struct Goodput {
  double checkpoint_bytes = 0, save_s = 0, mtbf_s = 0, interval_s = 0;
  int64_t interval_steps = 0;
  double fraction = 0;
};

// A checkpoint of `checkpoint_bytes` (the trainer's: fp32 parameters and AdamW's two moments) of a
// job whose step takes step_s on cluster c.
Goodput goodput(double checkpoint_bytes, double step_s, const Cluster& c);

}  // namespace lockstep::plan
