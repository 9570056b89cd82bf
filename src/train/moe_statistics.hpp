// The MoE layers' statistics in the training loop (src/model/moe_stats.hpp records them):
//   combine_moe_statistics  every rank: each MoE layer of the whole model summed over the ranks
//                           (one tensor-parallel rank of a group: they route alike; a pipeline
//                           stage adds zeros for the layers it does not hold);
//   moe_step_record         the JSONL record's "moe" object: per layer the tokens each expert was
//                           chosen by and kept, dropped (fraction of the choices), load (the
//                           expert chosen most over the mean: the router's balance, before the
//                           capacity), the balancing loss (mean over sequences)
//                           and the router's entropy (mean over tokens, nats);
//   update_selection_biases with [model] moe_bias_update = γ (DeepSeek-V3's aux-loss-free
//                           balancing): each expert's bias moves by γ towards the mean load,
//                           b += γ·sign(mean − routed), from the step's counts over all ranks (every
//                           rank moves every layer's bias alike);
//   MoeStatistics           the observer that does both after each step, writes the record every
//                           step and a console line every [log] every steps ([log] moe), and keeps
//                           the biases in checkpoints and rollback snapshots (state_key "moe").
// Not here: what is recorded (src/model/layers/moe.cpp).
#pragma once

#include <map>
#include <string>
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

void update_selection_biases(const std::vector<MoeLayerStats>& layers, float rate,
                             std::map<std::string, std::vector<float>>& biases);

class MoeStatistics final : public StepObserver {
 public:
  MoeStatistics(TrainRun& run, MetricsWriter& metrics) : run_(run), metrics_(metrics) {}
  void end_step(const StepRecord& r) override;
  std::string state_key() const override { return "moe"; }
  nlohmann::json save_state() const override;
  void restore_state(const nlohmann::json& state) override;

 private:
  TrainRun& run_;
  MetricsWriter& metrics_;
};

}  // namespace lockstep
