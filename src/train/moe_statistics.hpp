// The MoE layers' statistics in the training loop (src/model/moe_stats.hpp records them):
//   combine_moe_statistics  every rank: each MoE layer of the whole model summed over the ranks
//                           (one tensor-parallel rank of a group: they route alike; a pipeline
//                           stage adds zeros for the layers it does not hold);
//   moe_step_record         the JSONL record's "moe" object: per layer the tokens each expert was
//                           chosen by and kept, dropped (fraction of the choices), load (the
//                           expert chosen most over the mean: the router's balance, before the
//                           capacity), the balancing loss (mean over sequences)
//                           and the router's entropy (mean over tokens, nats);
//   MoeStatistics           the observer that writes it every step and prints a line every [log]
//                           every steps.
// Not here: what is recorded (src/model/layers/moe.cpp).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "src/model/moe_stats.hpp"
#include "src/train/metrics.hpp"
#include "src/train/run.hpp"
#include "src/train/step_observer.hpp"

namespace lockstep {

// Collective over run.world.
std::vector<MoeLayerStats> combine_moe_statistics(const TrainRun& run);

nlohmann::json moe_step_record(const std::vector<MoeLayerStats>& layers);

// The most chosen expert's choices over the mean (1: balanced; `experts` at worst).
double moe_load_imbalance(const MoeLayerStats& s);

class MoeStatistics final : public StepObserver {
 public:
  MoeStatistics(const TrainRun& run, MetricsWriter& metrics) : run_(run), metrics_(metrics) {}
  void end_step(const StepRecord& r) override;

 private:
  const TrainRun& run_;
  MetricsWriter& metrics_;
};

}  // namespace lockstep
