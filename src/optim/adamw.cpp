#include "src/optim/adamw.hpp"

#include <algorithm>

#include "kernels/ops/optim.hpp"
#include "src/core/det_math.hpp"

namespace lockstep {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = steps - warmup;
  if (decay_steps <= 1) return lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(decay_steps - 1);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + det::cos(det::kPi * std::min(progress, 1.0)));
}

AdamW::AdamW(const Model& model, AdamWConfig cfg)
    : cfg_(cfg), m_(model.num_params(), 0.0f), v_(model.num_params(), 0.0f) {}

float adamw_bias_correction(float beta, int64_t t) {
  double r = 1.0, b = beta;
  for (int64_t e = t; e > 0; e >>= 1) {
    if (e & 1) r *= b;
    b *= b;
  }
  return static_cast<float>(1.0 - r);
}

void adamw_update_range(Model& model, const AdamWConfig& cfg, float lr, int64_t t, int64_t first,
                        int64_t end, float* params, float* m, float* v, const float* grads) {
  const float bc1 = adamw_bias_correction(cfg.beta1, t);
  const float bc2 = adamw_bias_correction(cfg.beta2, t);
  const std::vector<ParamTensor>& layout = model.param_layout();
  for (size_t tensor = 0; tensor < layout.size(); ++tensor) {
    const ParamTensor& p = layout[tensor];
    const int64_t a = std::max(p.offset, first), b = std::min(p.offset + p.numel, end);
    if (a >= b) continue;
    const AdamWParams h{lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.decay.decays(p.klass) ? cfg.weight_decay : 0.0f,
                        bc1, bc2};
    model.backend().adamw_update(b - a, h, params + (a - first), m + (a - first), v + (a - first),
                                 grads + (a - first));
    if (!cfg.bf16_params) continue;
    const StochasticKey key{.seed = cfg.seed, .tensor = static_cast<uint32_t>(tensor), .step = static_cast<uint32_t>(t)};
    for (const IndexRun& r : p.global_runs(a - p.offset, b - p.offset)) {
      float* x = params + (p.offset + r.local - first);
      model.backend().round_to_bf16_stochastic(r.length, key, r.global, x, x);
    }
  }
}

void AdamW::update(Model& model, float lr, int64_t t) {
  adamw_update_range(model, cfg_, lr, t, 0, model.num_params(), model.params(), m_.data(), v_.data(),
                     model.grads());
}
}  // namespace lockstep
