// The FP8 recipe's statistics in the training loop (src/model/fp8_state.hpp holds them):
//   combine_fp8_statistics   after a step's backward, on every rank: the step's amax of each fp8
//                            tensor becomes the maximum over all ranks and its counts the sums, so
//                            every rank derives the same next scales whatever the layout; then the
//                            histories and scales move on (Fp8State::finish_step);
//   Fp8Statistics            the observer that keeps the state in checkpoints and snapshots
//                            (state_key "fp8"), writes each step's per-tensor statistics to the
//                            metrics JSONL ({"step", "fp8": {tensor: {amax, saturated, underflow,
//                            error_ratio, nonfinite, and with delayed scaling the scale the step
//                            used}}}: fractions of its elements, of its non-zero ones for underflow;
//                            Fp8TensorStats::error_ratio) and
//                            prints the worst tensors every [log] every steps.
// Not here: what an alarm about them decides (the fp8 sentinel, to come in verify/detect).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "src/comm/communicator.hpp"
#include "src/model/fp8_state.hpp"
#include "src/train/metrics.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"

namespace lockstep {

// Collective over `world`. A NaN amax is combined as +inf (both keep the scale: fp8_scale).
void combine_fp8_statistics(comm::Communicator& world, Fp8State& state);

// The step's statistics of every tensor as the JSONL record's "fp8" object.
nlohmann::json fp8_step_record(const Fp8State& state);

class Fp8Statistics final : public StepObserver {
 public:
  Fp8Statistics(const TrainRun& run, MetricsWriter& metrics) : run_(run), metrics_(metrics) {}
  void end_step(const StepRecord& r) override;
  std::string state_key() const override { return "fp8"; }
  nlohmann::json save_state() const override;
  void restore_state(const nlohmann::json& state) override;

 private:
  const TrainRun& run_;
  MetricsWriter& metrics_;
};

}  // namespace lockstep
