#include "src/model/moe_stats.hpp"

#include <algorithm>
#include <cmath>

namespace lockstep {

void MoeLayerStats::reset() {
  std::fill(routed.begin(), routed.end(), 0.0);
  std::fill(kept.begin(), kept.end(), 0.0);
  aux_loss = sequences = entropy = tokens = 0;
}

void MoeLayerStats::add_entropy(const float* probs, int64_t N, int64_t E) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) {
      const double p = probs[n * E + e];
      if (p > 0) entropy -= p * std::log(p);
    }
  }
  tokens += static_cast<double>(N);
}

}  // namespace lockstep
