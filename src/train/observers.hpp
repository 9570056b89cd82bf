// The trainer's step observers (step_observer.hpp) for what every run does:
//   Progress      the console line every [log] every steps and the JSONL record of every step
//                 (loss, lr, grad norm, tokens/s, MFU, memory, communication), and the first
//                 step's communication summary under a parallel layout;
//   Evaluation    the validation loss every [eval] every steps and at the end (first dp replica);
//   DumpSteps     [dump]: the step's tensors, reduced gradients and updated parameters, as whole
//                 tensors (gathered over tp and, for ZeRO-2's gradient shards, over dp).
// Fault injection (inject.hpp), checkpoints (checkpointing.hpp) and the detectors (verify/detect/)
// are observers too.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "src/data/sampler.hpp"
#include "src/train/metrics.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"
#include "verify/core/dump.hpp"

namespace lockstep {

class Progress final : public StepObserver {
 public:
  struct Costs {
    double flops_per_token = 0;  // of the whole model
    double peak_gflops = 0;      // one rank's
    uint64_t min_bytes = 0;      // the least a rank must send per step
    uint64_t full_grad_bytes = 0;  // the model's own gradient buffers
  };
  Progress(const TrainRun& run, MetricsWriter& metrics, Costs costs) : run_(run), metrics_(metrics), costs_(costs) {}
  void end_step(const StepRecord& r) override;

 private:
  const TrainRun& run_;
  MetricsWriter& metrics_;
  Costs costs_;
  bool first_ = true;
};

class Evaluation final : public StepObserver {
 public:
  // val: the validation reader; nullptr: no evaluation.
  Evaluation(TrainRun& run, MetricsWriter& metrics, data::EvalReader* val);
  void end_step(const StepRecord& r) override;
  float last_loss() const { return last_; }  // < 0: none yet

 private:
  float evaluate();
  TrainRun& run_;
  MetricsWriter& metrics_;
  data::EvalReader* val_;
  std::vector<int32_t> inputs_, targets_;
  float last_ = -1;
};

class DumpSteps final : public StepObserver {
 public:
  DumpSteps(TrainRun& run, verify::DumpWriter& dump) : run_(run), dump_(dump) {}
  void begin_step(int64_t step) override { dump_.begin_step(step); }
  void after_reduce(int64_t step, float loss) override;
  void after_update(int64_t step) override;

 private:
  // Dumps the whole tensors of `local` (this rank's flat buffer) as prefix + name, if `step` dumps
  // any of them: dp shards (dp_sharded: ZeRO-2's gradient, ZeRO-3's parameters) are gathered over
  // dp first, then the tp shards over tp. Collective; the decision is the same on every rank.
  void dump_params(int64_t step, const std::string& prefix, const float* local, bool dp_sharded);
  TrainRun& run_;
  verify::DumpWriter& dump_;
};

}  // namespace lockstep
