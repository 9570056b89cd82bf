// AdamW over the model's flat parameter buffer and the warm-up + cosine learning-rate schedule.
// Optimizer state (m, v) is laid out like the parameters.
// Not here: gradient clipping (grad_clip.hpp); sharding of the state across ranks (ZeRO lives in
// src/parallel).
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/model.hpp"
#include "src/optim/decay_policy.hpp"

namespace lockstep {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  DecayPolicy decay;  // the tensors weight_decay applies to
  // bf16 parameters (src/model/precision.hpp's bf16_params): each updated element rounded to bf16
  // stochastically, the Philox stream keyed by seed, the tensor's place in the canonical layout,
  // the step and the element's global index.
  bool bf16_params = false;
  uint64_t seed = 0;
};

struct LrSchedule {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup = 0;  // steps of linear warm-up
  int64_t steps = 1;   // total steps; cosine decay from warmup to steps

  // Learning rate of 0-based step `step`: lr·(step+1)/warmup during warm-up, then
  // min_lr + (lr − min_lr)·(1 + cos(π·progress))/2, with the deterministic cos of det_math.hpp.
  double at(int64_t step) const;
};

// AdamW's bias correction 1 − β^t for 1-based step t, rounded to fp32. β^t by binary powering in
// double: the same bits on every machine, which std::pow does not promise across libms.
float adamw_bias_correction(float beta, int64_t t);

// AdamW on the elements [first, end) of the model's flat parameter buffer (a ZeRO shard, or the
// whole model): params, m, v and grads hold exactly those elements (params[0] and m[0] are element
// `first`; params: the model's buffer from `first`, or a ZeRO-3 shard; grads: the model's own
// buffer from `first`, or a ZeRO-2 shard).
// Weight decay follows cfg.decay; a tensor cut by the range is updated in part. With
// cfg.bf16_params the updated elements are then rounded stochastically, each by its global index.
void adamw_update_range(Model& model, const AdamWConfig& cfg, float lr, int64_t t, int64_t first,
                        int64_t end, float* params, float* m, float* v, const float* grads);

class AdamW {
 public:
  AdamW(const Model& model, AdamWConfig cfg);

  // One update with 1-based step count t (bias corrections from adamw_bias_correction).
  void update(Model& model, float lr, int64_t t);

  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  AdamWConfig cfg_;
  std::vector<float> m_, v_;
};

}  // namespace lockstep
