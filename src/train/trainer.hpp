// The training loop: data -> model -> loss -> backward -> gradient sync -> clip -> AdamW, as
// set-up, resume and the step, with everything else a step observer (step_observer.hpp): fault
// injection, dumps, replica checks, per-step progress and JSONL metrics, periodic evaluation,
// checkpoints (and an emergency one on SIGINT/SIGTERM).
//
// Single process, or one rank of an MPI job (started by mpirun/srun; [parallel] gives the layout):
// each data-parallel rank trains on its part of the global batch (src/parallel/data_parallel.hpp);
// rank 0 prints, writes metrics, evaluates and writes checkpoints (whole tensors, ZeRO state
// gathered), so a checkpoint does not depend on the layout that wrote it.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "src/train/config.hpp"

namespace lockstep {

struct TrainSummary {
  int64_t first_step = 0;     // step the run started from (> 0 when resumed)
  int64_t steps_done = 0;     // steps completed in total (the checkpoint's step)
  float last_loss = 0;
  float val_loss = -1;        // < 0: no evaluation
  double tokens_per_s = 0;    // mean over this run's steps
  std::string model_hash;     // 16 hex digits, as `lockstep ckpt info` prints
  // 0, or why the run stopped early after saving a checkpoint: 130 a signal, detect::kExitSlowRank
  // a slow rank ([verify] on_straggler = "stop").
  int exit_status = 0;
};

TrainSummary train(const RunConfig& cfg, std::ostream& out);

}  // namespace lockstep
