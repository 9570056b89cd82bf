// The whole GPT training step as a reference, templated on the scalar type: forward, loss (mean
// over tokens), backward (every activation and parameter gradient), global-norm gradient clipping
// and AdamW — the model's layer list (src/model/layer_list.hpp) walked with the reference layers
// of reference/layers.hpp, in plain single-threaded loops, and src/optim's clip and update.
//
// Instantiations (docs/numerics.md, "The reference and its emulation"):
//   Mpfr (reference/real.hpp)          the "true" values at a chosen precision;
//   double                             quick checks;
//   Bounded<Mpfr>                      value + a bound valid for any summation order (fast mode);
//   CanonicalF32 (canonical_f32.hpp)   canonical mode's exact fp32 arithmetic and chunking: equal to
//                                      the canonical kernels bit for bit.
//
// The model is given by its description only (no dependency on src/ beyond it); the parameter
// layout (reference_param_layout) has the names, order and offsets of lockstep::Model's, so a flat
// fp32 buffer of the trainer converts element for element. Every tensor is reported to a hook under
// the same name as the model's TensorHook (`layer/3/attn/qkv`, `grad/logits`, ...), for the whole
// step's batch at once (the trainer reports each micro-batch; the verifier concatenates them).
// Everything is computed from the description: RoPE's tables too (reference/rope_tables.hpp). The
// pieces the CanonicalF32 emulation shares with the kernels as their specification are checked
// against MPFR before it runs (reference/canonical_checks.hpp).
// Not here: parallel layouts, data loading, checkpoints (the verifier's job).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/canonical_checks.hpp"
#include "reference/canonical_f32.hpp"
#include "reference/layers.hpp"
#include "reference/optim.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

// Optimizer hyperparameters of one step, as the trainer's fp32 values (lr from the schedule,
// bias corrections 1 − β^t as AdamW::update rounds them).
struct StepHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float bc1 = 1, bc2 = 1;
  float grad_clip = 0;  // 0: off
  std::array<bool, kNumParamClasses> decay_classes{};  // by ParamClass: weight decay applies
  // bf16 parameters (src/optim/adamw.hpp): each updated tensor rounded stochastically with the
  // stream of (seed, its place in the layout, step, global index).
  bool bf16_params = false;
  uint64_t seed = 0;
  uint32_t step = 0;  // 1-based
};

template <class Real>
class GptReference {
 public:
  // B: sequences of the step's batch; precision: the model's recipe (src/model/precision.hpp).
  GptReference(const ModelDesc& desc, int64_t B, PrecisionRecipe precision = {})
      : desc_(desc), B_(B), layout_(reference_param_layout(desc)), precision_(std::move(precision)) {
    if constexpr (std::is_same_v<Real, CanonicalF32>) check_canonical_pieces();
    const int64_t n = layout_.empty() ? 0 : layout_.back().offset + layout_.back().numel;
    params.assign(n, Real(0));
    m.assign(n, Real(0));
    v.assign(n, Real(0));
    grads_.reset(n);
    for (const auto& d : desc_.layers) layers_.push_back(make_ref_layer<Real>(d, B));
    const int64_t stream = B * desc_.config.seq_len * desc_.config.d_model;
    for (auto& g : stream_grad_) g.resize(stream);
  }
  // Delayed fp8 scaling: the scale of each fp8 tensor ("LINEAR/ROLE") this step, as the run's
  // state holds it (src/model/fp8_state.hpp).
  std::map<std::string, float> fp8_scales;
  // Aux-loss-free MoE balancing: each such layer's selection biases this step ("layer/3/moe" -> E),
  // added to the scores for the choice of experts only.
  std::map<std::string, std::vector<float>> selection_biases;
  GptReference(const GptReference&) = delete;
  GptReference& operator=(const GptReference&) = delete;

  const std::vector<ParamInfo>& layout() const { return layout_; }
  const ModelDesc& desc() const { return desc_; }

  std::vector<Real> params, m, v;  // flat, reference_param_layout order
  // Parameter gradients after forward_backward (before clipping; see clip_and_update).
  const std::vector<Real>& grads() const { return grads_.g; }
  std::vector<Real>& grads() { return grads_.g; }

  // Forward, loss and backward of the whole batch. `loss_segments`: token boundaries of the
  // trainer's micro-batches ({0, MB·T, 2·MB·T, ..., B·T}); dloss: the trainer's fp32 1/(B·T).
  // Returns the mean loss (the exact chunked sum of the per-token losses / (B·T), as the trainer).
  Real forward_backward(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                        const std::vector<int64_t>& loss_segments, float dloss, const RefHook<Real>& hook = {}) {
    RefStep<Real> s = step(inputs, targets, hook);
    s.dloss = Real(dloss);
    s.loss_segments = loss_segments;
    grads_.reset(static_cast<int64_t>(params.size()));
    forward(s);
    Real* dout = nullptr;
    for (size_t i = layers_.size(); i-- > 0;) {
      RefLayer<Real>& layer = *layers_[i];
      Real* dinp = nullptr;
      if (i > 0) {
        dinp = layer.residual() ? dout : (dout == stream_grad_[0].data() ? stream_grad_[1].data() : stream_grad_[0].data());
      }
      layer.backward(s, i > 0 ? layers_[i - 1]->output() : nullptr, dout, dinp);
      dout = dinp;
    }
    grads_.finish();
    return s.loss;
  }

  // Forward and mean loss only (finite-difference checks).
  Real loss(const int32_t* inputs, const int32_t* targets) {
    RefStep<Real> s = step(inputs, targets, {});
    s.eval = true;
    forward(s);
    return s.loss;
  }

  // clip_grad_norm then AdamW::update, on grads(): sumsq over every tensor (chunks restarting at
  // each tensor), norm = sqrt, and if grad_clip > 0 and norm > grad_clip every gradient is
  // scaled by grad_clip / (norm + 1e-6); then AdamW per tensor, weight decay on the tensors of
  // h.decay_classes, and with h.bf16_params the stochastic rounding. Returns the norm before
  // clipping.
  Real clip_and_update(const StepHyper& h) {
    using std::sqrt;
    std::vector<int64_t> bounds{0};
    for (const auto& t : layout_) bounds.push_back(t.offset + t.numel);
    auto& g = grads_.g;
    const Real norm = sqrt(sumsq_segments(g.data(), bounds));
    if (h.grad_clip > 0.0f && norm > Real(h.grad_clip)) {
      const Real scale = Real(h.grad_clip) / (norm + Real(1e-6f));
      for (auto& x : g) x = x * scale;
    }
    for (const auto& t : layout_) {
      const bool decays = h.decay_classes[static_cast<size_t>(t.klass)];
      const AdamWParams a{h.lr, h.beta1, h.beta2, h.eps, decays ? h.weight_decay : 0.0f, h.bc1, h.bc2};
      adamw_update(t.numel, a, params.data() + t.offset, m.data() + t.offset, v.data() + t.offset,
                   g.data() + t.offset);
      if (h.bf16_params) {
        Real* p = params.data() + t.offset;
        const auto tensor = static_cast<uint32_t>(&t - layout_.data());
        round_to_bf16_stochastic(t.numel, h.seed, tensor, h.step, 0, p, p);
      }
    }
    return norm;
  }

 private:
  RefStep<Real> step(const int32_t* inputs, const int32_t* targets, const RefHook<Real>& hook) {
    RefStep<Real> s;
    s.B = B_;
    s.T = desc_.config.seq_len;
    s.inputs = inputs;
    s.targets = targets;
    s.params = &params;
    s.grads = &grads_;
    s.layout = &layout_;
    s.hook = hook;
    s.precision = &precision_;
    s.fp8_scales = &fp8_scales;
    s.selection_biases = &selection_biases;
    return s;
  }
  void forward(RefStep<Real>& s) {
    const Real* in = nullptr;
    for (auto& layer : layers_) {
      layer->forward(s, in);
      in = layer->output();
    }
  }

  ModelDesc desc_;
  int64_t B_;
  std::vector<ParamInfo> layout_;
  PrecisionRecipe precision_;
  GradStore<Real> grads_;
  std::vector<std::unique_ptr<RefLayer<Real>>> layers_;
  std::vector<Real> stream_grad_[2];
};

}  // namespace lockstep::reference
