// `lockstep launch`: a supervisor over a training job (mpirun or srun with `lockstep train`, or the
// train command alone). It starts the job, passes its output through, and when the job fails in a
// way a restart can mend — a rank killed, the watchdog's exit, an MPI error, replicas found
// diverged — starts it again, up to a number of restarts with a growing backoff; the job resumes
// from its newest valid checkpoint by itself ([checkpoint] dir), so a restarted canonical run ends
// on the model of an uninterrupted one. Each restart is one line and a JSONL record: the cause,
// the last step reached, the step resumed from, the steps lost and the seconds from the failure to
// the resume. SIGTERM or SIGINT to the supervisor is passed to the job, which saves a checkpoint
// after its current step and stops, and is not restarted.
// Not restarted either: an input error (2) or a bug (3) — the same command fails the same way — and
// a detector's stop for a non-finite or spiking value (7) or a persistent fault (8), which a replay
// from the last checkpoint meets again; the supervisor says so, with the job's line naming the
// rank, and exits with the job's status.
// Spares (`--spares S` beside `--np N`): N + S processes are started and the job is the N listed in
// LOCKSTEP_ACTIVE_RANKS (comm::MpiRuntime::active_ranks), the others standing by. When the job
// stops on a slow rank (exit 9, [verify] on_straggler = "stop", after a checkpoint) or a persistent
// fault (exit 8), the ranks its last line names are given to spare processes — each in the place
// of the one it replaces, so the other ranks keep their processes — and the job is restarted; the
// processes taken out are not used again. Without a spare left such a stop is not restarted.
// Not here: the trainer's resume (checkpointing.hpp), the launcher itself (mpirun/srun: the
// command is given whole).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace lockstep {

struct LaunchOptions {
  std::vector<std::string> command;  // the job's argv
  int max_restarts = 3;
  double backoff_s = 1.0;  // before restart k: backoff_s · 2^(k−1), at most 60 s
  std::string log;         // JSONL file of the restarts ("" = none)
  // With spares: the command starts ranks + spares processes (mpirun -np, with
  // -x LOCKSTEP_ACTIVE_RANKS), of which `ranks` form the job.
  int ranks = 0;
  int spares = 0;
};

// Supervises the job; returns the status to exit with: 0 when the job succeeded, else its last
// status (128 + N for a signal N).
int launch(const LaunchOptions& opt, std::ostream& out);

}  // namespace lockstep
