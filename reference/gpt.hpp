// The whole GPT training step as a reference, templated on the scalar type: forward, loss (mean
// over tokens), backward (every activation and parameter gradient), global-norm gradient clipping
// and AdamW — built from the per-op references (reference/*.hpp) in plain single-threaded loops,
// mirroring src/model/gpt.cpp and src/optim/adamw.cpp op for op and buffer for buffer.
//
// Instantiations (DESIGN.md "The reference"):
//   Mpfr (reference/real.hpp)          the "true" values at a chosen precision;
//   double                             quick checks;
//   Bounded<Mpfr>                      value + a bound valid for any summation order (fast mode);
//   CanonicalF32 (canonical_f32.hpp)   canonical mode's exact fp32 arithmetic and chunking: equal to
//                                      the canonical kernels bit for bit.
//
// The model is given by GptDims (no dependency on src/); the parameter layout (gpt_param_layout)
// has the same names, order and offsets as lockstep::Gpt::param_layout(), so a flat fp32 buffer
// of the trainer converts element for element. Every tensor is reported to a hook under the same
// name as Gpt's TensorHook (`layer/3/attn/qkv`, `grad/logits`, ...), for the whole step's batch at
// once (the trainer reports each micro-batch; the verifier concatenates them).
//
// The batch is processed in one piece: every reduction over tokens runs over the step's global
// token index, which is how canonical mode chunks them whatever the micro-batching (token offsets
// of micro-batches are multiples of the chunk); the loss is the one sum whose chunks restart at
// each micro-batch (Gpt::forward_backward's add_losses), so its segments are an input.
// RoPE tables are inputs (the kernels' fp32 tables, built with the project's deterministic double
// math; exact in any Real).
// Not here: MoE, parallel layouts, data loading, checkpoints (the verifier's job).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "reference/activation.hpp"
#include "reference/attention.hpp"
#include "reference/crossentropy.hpp"
#include "reference/embedding.hpp"
#include "reference/linear.hpp"
#include "reference/norm.hpp"
#include "reference/optim.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

// The model's dimensions and variant (the [model] section, resolved).
struct GptDims {
  int64_t V = 0, T = 0, C = 0, L = 0, NH = 0, NKV = 0, F = 0;  // F: resolved ffn width
  bool swiglu = false;   // else GELU (tanh form)
  bool rmsnorm = false;  // else LayerNorm (with bias)
  bool rope = false;     // else learned positions (wpe)
  bool tie_embeddings = true;
  bool bias = true;      // linear biases
  float norm_eps = 1e-5f;

  int64_t HS() const { return C / NH; }
  int64_t qkv_width() const { return (NH + 2 * NKV) * HS(); }
  int64_t fc_out() const { return swiglu ? 2 * F : F; }
};

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  bool decay = false;  // AdamW weight decay (matrices and embeddings)
};

// Parameters in the canonical order of the forward pass (= Gpt::build_layout).
inline std::vector<ParamInfo> gpt_param_layout(const GptDims& d) {
  std::vector<ParamInfo> layout;
  int64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    layout.push_back({name, std::move(shape), offset, n, decay});
    offset += n;
  };
  const bool ln = !d.rmsnorm;
  add("wte", {d.V, d.C}, true);
  if (!d.rope) add("wpe", {d.T, d.C}, true);
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string p = "layer/" + std::to_string(l) + "/";
    add(p + "ln1/weight", {d.C}, false);
    if (ln) add(p + "ln1/bias", {d.C}, false);
    add(p + "attn/qkv/weight", {d.qkv_width(), d.C}, true);
    if (d.bias) add(p + "attn/qkv/bias", {d.qkv_width()}, false);
    add(p + "attn/proj/weight", {d.C, d.C}, true);
    if (d.bias) add(p + "attn/proj/bias", {d.C}, false);
    add(p + "ln2/weight", {d.C}, false);
    if (ln) add(p + "ln2/bias", {d.C}, false);
    add(p + "mlp/fc/weight", {d.fc_out(), d.C}, true);
    if (d.bias) add(p + "mlp/fc/bias", {d.fc_out()}, false);
    add(p + "mlp/proj/weight", {d.C, d.F}, true);
    if (d.bias) add(p + "mlp/proj/bias", {d.C}, false);
  }
  add("lnf/weight", {d.C}, false);
  if (ln) add("lnf/bias", {d.C}, false);
  if (!d.tie_embeddings) add("lm_head/weight", {d.V, d.C}, true);
  return layout;
}

// Optimizer hyperparameters of one step, as the trainer's fp32 values (lr from the schedule,
// bias corrections 1 − β^t as AdamW::update rounds them).
struct StepHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float bc1 = 1, bc2 = 1;
  float grad_clip = 0;  // 0: off
};

// Observer of every named tensor. It may overwrite the tensor (the computation continues from what
// it leaves there): `verify step` re-anchors the Bounded reference on the trainer's values so that
// each tensor is bounded for the ops since the previous hook point (op-local bounds), because
// worst-case bounds carried through a whole deep model grow by orders of magnitude per layer.
template <class Real>
using RefHook = std::function<void(std::string_view name, Real* data,
                                   const std::vector<int64_t>& shape)>;

template <class Real>
class GptReference {
 public:
  // B: sequences of the step's batch.
  GptReference(const GptDims& d, int64_t B, std::vector<float> rope_cos = {},
               std::vector<float> rope_sin = {})
      : d_(d), B_(B), layout_(gpt_param_layout(d)) {
    const int64_t n = layout_.back().offset + layout_.back().numel;
    params.assign(n, Real(0));
    m.assign(n, Real(0));
    v.assign(n, Real(0));
    grads_.reset(n);
    for (const auto& t : rope_cos) rope_cos_.push_back(Real(t));
    for (const auto& t : rope_sin) rope_sin_.push_back(Real(t));
    const int64_t BT = B * d.T, C = d.C;
    acts_.resize(d.L);
    for (auto& a : acts_) {
      for (auto* buf : {&a.ln1, &a.atty, &a.res_attn, &a.ln2, &a.res_mlp}) buf->resize(BT * C);
      for (auto* buf : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) buf->resize(BT);
      a.qkv.resize(BT * d.qkv_width());
      a.att.resize(B * d.NH * d.T * d.T);
      a.fch.resize(BT * d.fc_out());
      a.fch_act.resize(BT * d.F);
    }
    encoded_.resize(BT * C);
    lnf_.resize(BT * C);
    lnf_mean_.resize(BT);
    lnf_rstd_.resize(BT);
    logits_.resize(BT * d.V);
    losses_.resize(BT);
  }

  const std::vector<ParamInfo>& layout() const { return layout_; }
  const GptDims& dims() const { return d_; }

  std::vector<Real> params, m, v;  // flat, gpt_param_layout order
  // Parameter gradients after forward_backward (before clipping; see clip_and_update).
  const std::vector<Real>& grads() const { return grads_.g; }
  std::vector<Real>& grads() { return grads_.g; }

  // Forward, loss and backward of the whole batch. `loss_segments`: token boundaries of the
  // trainer's micro-batches ({0, MB·T, 2·MB·T, ..., B·T}); dloss: the trainer's fp32 1/(B·T).
  // Returns the mean loss (the exact chunked sum of the per-token losses / (B·T), as the trainer).
  Real forward_backward(const int32_t* inputs, const int32_t* targets,  // (B, T) (B, T)
                        const std::vector<int64_t>& loss_segments, float dloss,
                        const RefHook<Real>& hook = {}) {
    hook_ = hook;
    forward(inputs);
    const int64_t T = d_.T, C = d_.C, BT = B_ * T, F = d_.F, V = d_.V, fc_out = d_.fc_out();
    grads_.reset(static_cast<int64_t>(params.size()));

    // Loss and dlogits (in place over the logits).
    crossentropy_forward_backward(BT, V, Real(dloss), losses_.data(), logits_.data(), targets);
    observe("losses", losses_, {B_, T});
    observe("grad/logits", logits_, {B_, T, V});
    const Real loss = sum_segments(losses_.data(), loss_segments) / Real(static_cast<float>(BT));

    std::vector<Real> dres(BT * C, Real(0)), dbuf(BT * C), dqkv(BT * d_.qkv_width());
    std::vector<Real> datty(BT * C), datt(B_ * d_.NH * T * T), dfch(BT * fc_out), dfch_act(BT * F);
    linear_backward(BT, C, V, dbuf.data(), sink(head()), GradOut<Real>{}, logits_.data(),
                    lnf_.data(), p(head()));
    observe("grad/lnf/out", dbuf, {B_, T, C});
    const Real* last = d_.L > 0 ? acts_.back().res_mlp.data() : encoded_.data();
    norm_backward(dres.data(), dbuf.data(), last, lnf_mean_.data(), lnf_rstd_.data(),
                  find("lnf/weight"), find("lnf/bias"));
    for (int64_t l = d_.L - 1; l >= 0; --l) {
      Acts& a = acts_[l];
      const std::string pre = "layer/" + std::to_string(l) + "/";
      const Real* residual_in = l == 0 ? encoded_.data() : acts_[l - 1].res_mlp.data();
      observe("grad/" + pre + "mlp/res", dres, {B_, T, C});
      // MLP: x2 = x1 + proj(act(fc(norm2(x1))))
      linear_backward(BT, F, C, dfch_act.data(), sink(find(pre + "mlp/proj/weight")),
                      sink(find(pre + "mlp/proj/bias")), dres.data(), a.fch_act.data(),
                      p(find(pre + "mlp/proj/weight")));
      observe("grad/" + pre + "mlp/act", dfch_act, {B_, T, F});
      if (d_.swiglu) {
        swiglu_backward(BT, F, dfch.data(), a.fch.data(), dfch_act.data());
      } else {
        gelu_backward(BT * F, dfch.data(), a.fch.data(), dfch_act.data());
      }
      observe("grad/" + pre + "mlp/fc", dfch, {B_, T, fc_out});
      linear_backward(BT, C, fc_out, dbuf.data(), sink(find(pre + "mlp/fc/weight")),
                      sink(find(pre + "mlp/fc/bias")), dfch.data(), a.ln2.data(),
                      p(find(pre + "mlp/fc/weight")));
      observe("grad/" + pre + "ln2/out", dbuf, {B_, T, C});
      norm_backward(dres.data(), dbuf.data(), a.res_attn.data(), a.ln2_mean.data(),
                    a.ln2_rstd.data(), find(pre + "ln2/weight"), find(pre + "ln2/bias"));
      observe("grad/" + pre + "attn/res", dres, {B_, T, C});
      // Attention: x1 = x0 + proj(attn(rope(qkv(norm1(x0)))))
      linear_backward(BT, C, C, datty.data(), sink(find(pre + "attn/proj/weight")),
                      sink(find(pre + "attn/proj/bias")), dres.data(), a.atty.data(),
                      p(find(pre + "attn/proj/weight")));
      observe("grad/" + pre + "attn/out", datty, {B_, T, C});
      attention_backward(B_, T, d_.NH, d_.NKV, d_.HS(), dqkv.data(), datt.data(), datty.data(),
                         a.qkv.data(), a.att.data());
      observe("grad/" + pre + "attn/qkv", dqkv, {B_, T, d_.qkv_width()});
      if (d_.rope) {
        rope_backward(B_, T, d_.NH, d_.NKV, d_.HS(), dqkv.data(), rope_cos_.data(),
                      rope_sin_.data());
      }
      linear_backward(BT, C, d_.qkv_width(), dbuf.data(), sink(find(pre + "attn/qkv/weight")),
                      sink(find(pre + "attn/qkv/bias")), dqkv.data(), a.ln1.data(),
                      p(find(pre + "attn/qkv/weight")));
      observe("grad/" + pre + "ln1/out", dbuf, {B_, T, C});
      norm_backward(dres.data(), dbuf.data(), residual_in, a.ln1_mean.data(), a.ln1_rstd.data(),
                    find(pre + "ln1/weight"), find(pre + "ln1/bias"));
    }
    observe("grad/embed/out", dres, {B_, T, C});
    embedding_backward(B_, T, C, V, sink(find("wte")), sink(find("wpe")), dres.data(), inputs);
    grads_.finish();
    hook_ = {};
    return loss;
  }

  // Forward and mean loss only (finite-difference checks).
  Real loss(const int32_t* inputs, const int32_t* targets) {
    forward(inputs);
    const int64_t BT = B_ * d_.T;
    crossentropy_forward(BT, d_.V, losses_.data(), logits_.data(), targets);
    return sum(losses_.data(), 1, BT) / Real(static_cast<float>(BT));
  }

  // clip_grad_norm then AdamW::update, on grads(): sumsq over every tensor (chunks restarting at
  // each tensor), norm = sqrt, and if grad_clip > 0 and norm > grad_clip every gradient is
  // scaled by grad_clip / (norm + 1e-6); then AdamW per tensor, weight decay on `decay` tensors.
  // Returns the norm before clipping.
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
      const AdamWParams a{h.lr, h.beta1, h.beta2, h.eps, t.decay ? h.weight_decay : 0.0f,
                          h.bc1, h.bc2};
      adamw_update(t.numel, a, params.data() + t.offset, m.data() + t.offset,
                   v.data() + t.offset, g.data() + t.offset);
    }
    return norm;
  }

 private:
  struct Acts {
    std::vector<Real> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_attn;
    std::vector<Real> ln2, ln2_mean, ln2_rstd, fch, fch_act, res_mlp;
  };

  const ParamInfo* find(const std::string& name) const {
    for (const auto& t : layout_)
      if (t.name == name) return &t;
    return nullptr;
  }
  const ParamInfo* head() const { return find(d_.tie_embeddings ? "wte" : "lm_head/weight"); }
  Real* p(const ParamInfo* t) { return t ? params.data() + t->offset : nullptr; }
  GradOut<Real> sink(const ParamInfo* t) { return t ? grads_.out(t->offset) : GradOut<Real>{}; }
  void observe(const std::string& name, std::vector<Real>& x,
               const std::vector<int64_t>& shape) const {
    if (hook_) hook_(name, x.data(), shape);
  }

  void norm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const ParamInfo* w,
                    const ParamInfo* b) {
    const int64_t N = B_ * d_.T;
    if (d_.rmsnorm) {
      rmsnorm_forward(N, d_.C, d_.norm_eps, out, rstd, inp, p(w));
    } else {
      layernorm_forward(N, d_.C, d_.norm_eps, out, mean, rstd, inp, p(w), p(b));
    }
  }
  void norm_backward(Real* dinp, const Real* dout, const Real* inp, const Real* mean,
                     const Real* rstd, const ParamInfo* w, const ParamInfo* b) {
    const int64_t N = B_ * d_.T;
    if (d_.rmsnorm) {
      rmsnorm_backward(N, d_.C, dinp, sink(w), dout, inp, p(w), rstd);
    } else {
      layernorm_backward(N, d_.C, dinp, sink(w), sink(b), dout, inp, p(w), mean, rstd);
    }
  }

  void forward(const int32_t* inputs) {
    const int64_t T = d_.T, C = d_.C, BT = B_ * T, F = d_.F, NH = d_.NH;
    embedding_forward(B_, T, C, d_.V, encoded_.data(), inputs, p(find("wte")), p(find("wpe")));
    observe("embed/out", encoded_, {B_, T, C});
    const Real* residual = encoded_.data();
    for (int64_t l = 0; l < d_.L; ++l) {
      Acts& a = acts_[l];
      const std::string pre = "layer/" + std::to_string(l) + "/";
      // x = x + attn(norm1(x))
      norm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                   find(pre + "ln1/weight"), find(pre + "ln1/bias"));
      observe(pre + "ln1/out", a.ln1, {B_, T, C});
      linear_forward(BT, C, d_.qkv_width(), a.qkv.data(), a.ln1.data(),
                     p(find(pre + "attn/qkv/weight")), p(find(pre + "attn/qkv/bias")));
      if (d_.rope) {
        rope_forward(B_, T, NH, d_.NKV, d_.HS(), a.qkv.data(), rope_cos_.data(), rope_sin_.data());
      }
      observe(pre + "attn/qkv", a.qkv, {B_, T, d_.qkv_width()});
      attention_forward(B_, T, NH, d_.NKV, d_.HS(), a.atty.data(), a.att.data(), a.qkv.data());
      observe(pre + "attn/att", a.att, {B_, NH, T, T});
      observe(pre + "attn/out", a.atty, {B_, T, C});
      linear_forward(BT, C, C, a.res_attn.data(), a.atty.data(), p(find(pre + "attn/proj/weight")),
                     p(find(pre + "attn/proj/bias")));
      residual_forward(BT * C, a.res_attn.data(), a.res_attn.data(), residual);
      observe(pre + "attn/res", a.res_attn, {B_, T, C});
      // x = x + mlp(norm2(x))
      norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res_attn.data(),
                   find(pre + "ln2/weight"), find(pre + "ln2/bias"));
      observe(pre + "ln2/out", a.ln2, {B_, T, C});
      linear_forward(BT, C, d_.fc_out(), a.fch.data(), a.ln2.data(), p(find(pre + "mlp/fc/weight")),
                     p(find(pre + "mlp/fc/bias")));
      observe(pre + "mlp/fc", a.fch, {B_, T, d_.fc_out()});
      if (d_.swiglu) {
        swiglu_forward(BT, F, a.fch_act.data(), a.fch.data());
      } else {
        gelu_forward(BT * F, a.fch_act.data(), a.fch.data());
      }
      observe(pre + "mlp/act", a.fch_act, {B_, T, F});
      linear_forward(BT, F, C, a.res_mlp.data(), a.fch_act.data(), p(find(pre + "mlp/proj/weight")),
                     p(find(pre + "mlp/proj/bias")));
      residual_forward(BT * C, a.res_mlp.data(), a.res_mlp.data(), a.res_attn.data());
      observe(pre + "mlp/res", a.res_mlp, {B_, T, C});
      residual = a.res_mlp.data();
    }
    norm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual, find("lnf/weight"),
                 find("lnf/bias"));
    observe("lnf/out", lnf_, {B_, T, C});
    linear_forward(BT, C, d_.V, logits_.data(), lnf_.data(), p(head()), static_cast<Real*>(nullptr));
    observe("logits", logits_, {B_, T, d_.V});
  }

  GptDims d_;
  int64_t B_;
  std::vector<ParamInfo> layout_;
  GradStore<Real> grads_;
  std::vector<Real> rope_cos_, rope_sin_;
  std::vector<Real> encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  std::vector<Acts> acts_;
  RefHook<Real> hook_;
};

}  // namespace lockstep::reference
