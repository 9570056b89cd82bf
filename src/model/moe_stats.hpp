// What the MoE layers saw in a step, for the logs: per layer, each expert's choices before and
// after the capacity, the load-balancing loss and the router's entropy. Recorded in training
// passes only (not evaluation, nor a recomputed forward); reset when a step begins.
// Not here: combining them over ranks and writing them (src/train/moe_statistics.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct MoeLayerStats {
  std::string layer;                  // "layer/3/moe"
  std::vector<double> routed, kept;   // per expert: choices of it, and those within its capacity
  double aux_loss = 0;                // sum over the step's sequences of the balancing loss
  double sequences = 0;
  double entropy = 0;                 // sum over tokens of −Σ p·ln p of the router (nats)
  double tokens = 0;

  void reset();
  // The router's entropy of N tokens of E probabilities, added (in double).
  void add_entropy(const float* probs, int64_t N, int64_t E);
};

}  // namespace lockstep
