// The detectors' settings as [verify] gives them and the state a rank keeps between steps, built
// the same way by the trainer (trainer.cpp) and by `lockstep bench`, which times the detectors.
#pragma once

#include <span>
#include <vector>

#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/train/config.hpp"
#include "verify/detect/fp8_sentinel.hpp"
#include "verify/detect/spikes.hpp"
#include "verify/detect/state_at_rest.hpp"

namespace lockstep {

inline detect::SpikeRule spike_rule(const VerifyConfig& v) {
  return {.window = v.spike_window, .loss_threshold = v.loss_spike_threshold,
          .grad_norm_threshold = v.grad_norm_spike_threshold};
}

// The fp8 sentinel's rule as [verify] configures it.
inline detect::Fp8SentinelRule fp8_sentinel_rule(const VerifyConfig& v) {
  return {.every = v.fp8_sentinel_every,
          .rows = v.fp8_sentinel_rows,
          .lambda = v.fp8_sentinel_lambda,
          .saturation = v.fp8_saturation_threshold,
          .underflow = v.fp8_underflow_threshold,
          .patience = v.fp8_patience};
}

// The parameters and AdamW moments (this rank's: all of them, or its ZeRO shard).
inline std::vector<detect::RestingBuffer> resting_state(std::span<const float> params, std::span<const float> m,
                                                         std::span<const float> v) {
  return {{"parameters", params}, {"optim/m", m}, {"optim/v", v}};
}

// The state at rest of a model and its optimizer in one process, which holds all of them (`lockstep
// bench` and the planner's pass timing, which run the detector on their own model).
inline std::vector<detect::RestingBuffer> resting_state(const Model& model, const AdamW& adamw) {
  return resting_state({model.params(), static_cast<size_t>(model.num_params())}, adamw.m(), adamw.v());
}

}  // namespace lockstep
