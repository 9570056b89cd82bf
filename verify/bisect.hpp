// `lockstep bisect`: the first step and the first op at which two training runs stop agreeing.
//
// The two sides are `lockstep train` argument lists (and optionally two executables, two rank
// counts), run as child processes with checkpoints, metrics and dumps in a work directory that
// bisect owns:
//   1. scan: each side trains the whole run once, checkpointing every K steps (K ≈ √steps unless
//      given); the per-step losses (metrics) and the checkpoints' digests (model hash, xxh64 of
//      every parameter and AdamW moment, sampler state) are compared. The first step whose loss
//      differs and the first checkpoint whose state differs bound the divergent step d from above;
//      the last agreeing checkpoint c below it bounds it from below (c <= d, at most K steps apart);
//   2. refine: each side resumes from checkpoint c (never from zero) with a checkpoint after every
//      step, up to d's upper bound, which pins d: the first step whose loss or resulting state
//      differs while the state it started from agrees. The re-run losses must equal the scan's
//      (a side that does not reproduce itself is reported, since its "divergence" may be noise);
//   3. dump: each side resumes from the checkpoint before d and runs step d alone with every hook
//      dumped; the dumps are diffed (verify/diff.hpp) and the first tensor in execution order that
//      differs is the output of the first op whose inputs agree while its output does not (its
//      inputs are listed and checked). With `bounds`, "agree" means each side's tensor is within
//      the derived op-local bound of the exact op on that side's own inputs (verify/op_bounds.hpp).
// Runs stop at a chosen step through the trainer's [train] stop_after: the child ends after the
// target step as a run ending there would (metrics, checkpoint), with the LR schedule of all
// steps, so no step past the target runs.
// Not here: argument parsing (src/cli/cmd_bisect.cpp), child processes (src/core/child_process.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::verify {

struct BisectSide {
  std::string label;              // "A" or "B"
  std::string bin;                // lockstep executable
  std::vector<std::string> args;  // `lockstep train` arguments (--config FILE, overrides)
  int64_t np = 1;                 // ranks; > 1 runs under the launcher
};

struct BisectOptions {
  BisectSide a, b;
  int64_t steps = 0;     // steps of the run ([train] steps)
  int64_t every = 0;     // scan checkpoint interval (0: round(√steps))
  std::string out;       // work directory (must not hold a bisect already)
  bool bounds = false;   // ops agree within derived bounds instead of bitwise
  std::string launcher;  // words before the executable when np > 1; {np} is replaced
};

// One run of a side as a child process, for the cost table and the reproduce commands.
struct BisectRun {
  std::string side, phase;        // "A"/"B"; "scan", "refine", "dump"
  std::vector<std::string> argv;  // exactly as started
  std::string log;
  int64_t from_step = 0;          // steps done when it started
  int64_t steps_executed = 0;     // metrics records it wrote
  double seconds = 0;
};

struct BisectResult {
  bool diverged = false;
  int64_t every = 0;
  int64_t step = -1;            // first divergent step (0-based, as dump names: step/<N>/...)
  std::string why;              // what differs at that step: loss, state tensors
  std::string op;               // first divergent op's output tensor ("" when not named)
  std::string op_note;          // inputs and their status, or why no op could be named
  nlohmann::json op_detail;     // the TensorDiff (and bound) of the op and its inputs
  std::vector<BisectRun> runs;
  int64_t steps_executed = 0;   // all children together
  int64_t steps_reexecuted = 0; // beyond one pass of each side over the run
  double seconds = 0;
  std::vector<std::string> warnings;

  nlohmann::json to_json() const;
  void print_summary(std::ostream& os) const;
  std::string markdown(const BisectOptions& opt) const;
};

// K for `steps` when none is given: round(√steps), at least 1 — balances scan checkpoints
// (steps / K) against the refine re-run (at most K steps per side).
int64_t default_bisect_every(int64_t steps);

// Checks the options (ConfigError naming the option), runs everything, writes
// <out>/bisect-report.md and <out>/bisect.json. DataError when a side fails to run, naming its
// log. Progress lines go to `progress`.
BisectResult bisect(const BisectOptions& opt, std::ostream& progress);

}  // namespace lockstep::verify
