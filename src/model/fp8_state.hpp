// The run-time state of an FP8 recipe (fp8_recipe.hpp): per tensor of every FP8 linear of the
// whole model (input, weight, grad_output; a pipeline stage keeps the entries of every stage, so
// that the ranks' statistics line up), the step's statistics so far and, for delayed scaling, the
// amax history and the scale the step uses.
//
// A step: the FP8 linears record what each quantization met (record); after the step's backward
// the trainer combines the statistics over every rank (amax: maximum; counts: sums — exact, so the
// result does not depend on the layout) and calls finish_step(), which puts each tensor's step amax
// into its history (delayed scaling) and derives the next step's scale from it:
// fp8_scale(max or most recent of the history, format, margin, power of two, previous scale).
// The histories and scales are part of checkpoints and in-memory snapshots (save / restore), so a
// resumed or replayed run continues bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops/quantize.hpp"
#include "src/model/fp8_recipe.hpp"

namespace lockstep {

// One tensor's statistics over a step (or what the ranks together met).
struct Fp8TensorStats {
  float amax = 0.0f;
  double numel = 0, saturated = 0, underflowed = 0, nonzero = 0, nonfinite = 0;
  double err_sq = 0, bound_sq = 0;  // kernels/ops/quantize.hpp's energies

  void add(const Fp8Counts& c, int64_t n);
  double saturated_fraction() const { return numel > 0 ? saturated / numel : 0.0; }
  double underflow_fraction() const { return nonzero > 0 ? underflowed / nonzero : 0.0; }
  // ‖quantization error‖₂ / ‖what rounding alone may cost‖₂: above 1 only through saturation.
  double error_ratio() const { return bound_sq > 0 ? std::sqrt(err_sq / bound_sq) : 0.0; }
};

class Fp8State {
 public:
  // linears: the model's FP8 linears, in layer order.
  Fp8State(const Fp8Recipe& recipe, const std::vector<std::string>& linears);

  const Fp8Recipe& recipe() const { return recipe_; }
  size_t size() const { return tensors_.size(); }
  // Tensor i: "LINEAR/ROLE", e.g. "layer/0/mlp/fc/grad_output".
  const std::string& name(size_t i) const { return tensors_[i].name; }
  Fp8Role role(size_t i) const { return tensors_[i].role; }
  // The entry of linear's tensor `role`.
  size_t index(const std::string& linear, Fp8Role role) const;
  // The entry named `name` ("LINEAR/ROLE"), SIZE_MAX if none.
  size_t find(const std::string& name) const;

  // Delayed scaling: the scale tensor i uses this step, and the one the last finished step used.
  float scale(size_t i) const { return tensors_[i].scale; }
  float last_scale(size_t i) const { return tensors_[i].last_scale; }
  // Sets the scale tensor i uses in the rest of this step (fault injection: src/train/inject.hpp).
  void force_scale(size_t i, float scale) {
    tensors_[i].scale = scale;
    ++generation_;
  }
  // Whether that scale came from data: always, but for delayed scaling before any history (the
  // first step runs on scale 1).
  bool last_scale_from_data(size_t i) const { return tensors_[i].last_from_data; }
  void record(size_t i, const Fp8Counts& c, int64_t numel);
  const Fp8TensorStats& step_stats(size_t i) const { return tensors_[i].step; }

  // The step's statistics as two flat arrays, for the ranks' combination: amax per tensor, and
  // the counts and energies per tensor (sums); set_step_stats puts the combined ones back.
  std::vector<float> step_amax() const;
  std::vector<double> step_counts() const;
  void set_step_stats(const std::vector<float>& amax, const std::vector<double>& counts);

  // After the combination: histories and scales move on; the step's statistics stay readable
  // (step_stats) until the next record.
  void finish_step();
  // Moves on with every finish_step and restore: what was quantized under an older generation
  // (a weight's copy: src/model/fp8_linear.cpp) may have another scale or weight now.
  uint64_t generation() const { return generation_; }

  nlohmann::json save() const;
  void restore(const nlohmann::json& j);  // throws std::runtime_error naming what does not fit

 private:
  struct Tensor {
    std::string name;
    Fp8Role role;
    float scale = 1.0f, last_scale = 1.0f;
    bool last_from_data = false;
    std::vector<float> history = {};  // oldest first, at most amax_history_len
    Fp8TensorStats step = {};
    bool stale = false;               // finish_step ran: the next record starts a new step
  };
  Fp8Recipe recipe_;
  std::vector<Tensor> tensors_;
  uint64_t generation_ = 0;
};

}  // namespace lockstep
