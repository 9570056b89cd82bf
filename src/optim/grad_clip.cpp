#include "src/optim/grad_clip.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/ops/optim.hpp"

namespace lockstep {

std::optional<float> clip_scale(float norm, float max_norm) {
  if (!(max_norm > 0.0f && norm > max_norm)) return std::nullopt;
  return max_norm / (norm + 1e-6f);
}

float clip_grad_norm(const Model& model, const GradPart& part, float max_norm,
                     const std::function<float(const ChunkCombiner&)>& total) {
  ChunkCombiner sumsq;
  for (const auto& p : model.param_layout()) {
    if ((part.skip_replicated && p.replicated()) || (part.skip_shared && !p.is_expert())) continue;
    const int64_t a = std::max(p.offset, part.first), b = std::min(p.offset + p.numel, part.end);
    if (a < b) model.backend().grad_sumsq_accumulate(model.mode(), b - a, sumsq, part.grads + (a - part.first));
  }
  const float norm = std::sqrt(total(sumsq));
  if (const auto scale = clip_scale(norm, max_norm)) model.backend().scale_inplace(part.end - part.first, part.grads, *scale);
  return norm;
}

float clip_grad_norm(Model& model, float max_norm) {
  return clip_grad_norm(model, {0, model.num_params(), model.grads()}, max_norm,
                        [](const ChunkCombiner& own) { return own.finish(); });
}

}  // namespace lockstep
