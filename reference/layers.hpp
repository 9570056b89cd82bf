// The reference's layers: each layer kind of the model list (src/model/layer_list.hpp) in plain
// single-threaded loops over a generic scalar Real, op for op and buffer for buffer the kernel
// calls of src/model/layers/, on the whole step's batch at once. Walked by reference/gpt.hpp.
//
// Every reduction over tokens runs over the step's global token index, which is how canonical
// mode chunks them whatever the micro-batching (token offsets of micro-batches are multiples of
// the chunk). Each layer reports its tensors to the step's hook under the declared names, its
// forward outputs as computed and, at the end of its backward, the gradient of its input. A bf16
// recipe (src/model/precision.hpp) rounds where the model's layers do: the activations a bf16
// linear reads as they are stored, its weight and output gradient as it reads them, its product and
// input gradient as it writes them (reference/cast.hpp's bf16_rounded: the rounding itself for
// CanonicalF32, a grown bound for Bounded<T>).
// Not here: which layers (the description), the optimizer (reference/optim.hpp), anything of
// kernels/ or the trainer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "reference/activation.hpp"
#include "reference/attention.hpp"
#include "reference/canonical_f32.hpp"
#include "reference/cast.hpp"
#include "reference/crossentropy.hpp"
#include "reference/embedding.hpp"
#include "reference/linear.hpp"
#include "reference/moe.hpp"
#include "reference/norm.hpp"
#include "reference/quantize.hpp"
#include "reference/reduce.hpp"
#include "reference/rope_tables.hpp"
#include "src/model/layer_list.hpp"
#include "src/model/precision.hpp"

namespace lockstep::reference {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  ParamClass klass = ParamClass::kMatrix;  // weight decay applies by class (StepHyper)
};

// Parameters in the canonical order of the description (that of src/model/param_layout.hpp).
inline std::vector<ParamInfo> reference_param_layout(const ModelDesc& desc) {
  std::vector<ParamInfo> layout;
  int64_t offset = 0;
  for (const ParamDecl* p : model_params(desc)) {
    int64_t n = 1;
    for (auto s : p->shape) n *= s;
    layout.push_back({p->name, p->shape, offset, n, p->klass});
    offset += n;
  }
  return layout;
}

// Observer of every named tensor. It may overwrite the tensor (the computation continues from what
// it leaves there): `verify step` re-anchors the Bounded reference on the trainer's values so that
// each tensor is bounded for the ops since the previous hook point (op-local bounds), because
// worst-case bounds carried through a whole deep model grow by orders of magnitude per layer.
template <class Real>
using RefHook = std::function<void(std::string_view name, Real* data, const std::vector<int64_t>& shape)>;

// What the layers of one reference step share.
template <class Real>
struct RefStep {
  int64_t B = 0, T = 0;
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  std::vector<Real>* params = nullptr;
  GradStore<Real>* grads = nullptr;
  const std::vector<ParamInfo>* layout = nullptr;
  RefHook<Real> hook;
  Real dloss = Real(0);
  const PrecisionRecipe* precision = nullptr;  // nullptr: fp32 throughout
  // Delayed fp8 scaling: each fp8 tensor's scale this step ("LINEAR/ROLE", src/model/fp8_state.hpp).
  const std::map<std::string, float>* fp8_scales = nullptr;
  // MoE selection biases ("layer/3/moe" -> E; GptReference::selection_biases).
  const std::map<std::string, std::vector<float>>* selection_biases = nullptr;
  std::vector<int64_t> loss_segments;  // token boundaries of the trainer's micro-batches
  Real loss = Real(0);                 // the loss layer's mean loss
  bool eval = false;                   // forward only: the loss layer's forward computes the loss

  int64_t BT() const { return B * T; }
  bool bf16(const std::string& linear) const { return precision != nullptr && precision->low_precision(linear); }
  // n values that linear `linear` reads (or wrote), stored in its precision.
  void store_for(const std::string& linear, Real* x, int64_t n) const {
    if (bf16(linear)) round_to_bf16(n, x, x);
  }
  bool fp8(const std::string& linear) const { return precision != nullptr && precision->fp8_linear(linear); }
  // x (rows × cols) as tensor `role` of fp8 linear `linear` reads it in direction d
  // (src/model/fp8_linear.cpp): an activation or gradient one micro-batch (loss_segments) at a
  // time where its rows are the step's tokens (token_rows), else as one GEMM's operand (a MoE
  // expert's rows), a weight whole; its scale the recipe's — delayed from fp8_scales, current from
  // the amax of what is quantized, blocks their own.
  std::vector<Real> fp8_quantized(const std::string& linear, Fp8Role role, Fp8Direction d, const Real* x, int64_t rows,
                                  int64_t cols, bool token_rows = true) const {
    const Fp8Recipe& r = precision->fp8;
    std::vector<Real> out(static_cast<size_t>(rows * cols));
    std::vector<int64_t> cuts = {0, rows};
    if (role != Fp8Role::kWeight && token_rows && loss_segments.size() >= 2) cuts = loss_segments;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t r0 = cuts[k], r1 = cuts[k + 1];
      float scale = 1.0f;
      if (r.scaling == Fp8Scaling::kDelayed) {
        scale = fp8_scales->at(linear + "/" + fp8_role_name(role));
      } else if (r.scaling == Fp8Scaling::kCurrent) {
        double amax = 0;
        for (int64_t i = r0 * cols; i < r1 * cols; ++i) amax = std::max(amax, std::fabs(value_of(x[i])));
        scale = fp8_tensor_scale(amax, r.format(role), static_cast<int>(r.margin), r.power_of_two, 1.0f);
      }
      const QuantizeShape q = r.shape(role, d, r1 - r0, cols, scale);
      quantize_fp8(r1 - r0, cols, Fp8Quantization{q.format, q.scaling, q.block_rows, q.block_cols, q.scale},
                   out.data() + r0 * cols, x + r0 * cols);
    }
    return out;
  }
  const ParamInfo* find(const std::string& name) const {
    for (const auto& t : *layout)
      if (t.name == name) return &t;
    return nullptr;
  }
  Real* p(const ParamInfo* t) { return t ? params->data() + t->offset : nullptr; }
  GradOut<Real> sink(const ParamInfo* t) { return t ? grads->out(t->offset) : GradOut<Real>{}; }
  void observe(const std::string& name, std::vector<Real>& x, const std::vector<int64_t>& shape) const {
    if (hook) hook(name, x.data(), shape);
  }
  void observe(const std::string& name, Real* x, const std::vector<int64_t>& shape) const {
    if (hook) hook(name, x, shape);
  }
};

template <class Real>
class RefLayer {
 public:
  explicit RefLayer(const LayerDesc& d) : d_(d) {}
  virtual ~RefLayer() = default;
  const LayerDesc& desc() const { return d_; }
  // in: the previous layer's output (nullptr for the embedding).
  virtual void forward(RefStep<Real>& s, const Real* in) = 0;
  virtual Real* output() = 0;
  // dout: gradient of the output (nullptr for the loss layer); dinp: where the input's goes
  // (== dout for a residual layer, nullptr for the embedding).
  virtual void backward(RefStep<Real>& s, const Real* in, Real* dout, Real* dinp) = 0;
  virtual bool residual() const { return false; }

 protected:
  std::string n(std::string_view local) const { return d_.prefix + std::string(local); }
  void norm_forward(RefStep<Real>& s, Real* out, Real* mean, Real* rstd, const Real* inp, const ParamInfo* w,
                    const ParamInfo* b) {
    const int64_t N = s.BT();
    if (d_.norm == NormKind::kRmsNorm) {
      rmsnorm_forward(N, d_.dims.C, d_.norm_eps, out, rstd, inp, s.p(w));
    } else {
      layernorm_forward(N, d_.dims.C, d_.norm_eps, out, mean, rstd, inp, s.p(w), s.p(b));
    }
  }
  void norm_backward(RefStep<Real>& s, Real* dinp, const Real* dout, const Real* inp, const Real* mean,
                     const Real* rstd, const ParamInfo* w, const ParamInfo* b) {
    const int64_t N = s.BT();
    if (d_.norm == NormKind::kRmsNorm) {
      rmsnorm_backward(N, d_.dims.C, dinp, s.sink(w), dout, inp, s.p(w), rstd);
    } else {
      layernorm_backward(N, d_.dims.C, dinp, s.sink(w), s.sink(b), dout, inp, s.p(w), mean, rstd);
    }
  }

  // The model's linear `linear` (src/model/layers/, bf16_linear.cpp, fp8_linear.cpp) in the step's
  // precision. An fp8 linear's GEMMs read quantized copies of the bf16 operands, each in its
  // direction; its bias gradient comes from the bf16 output gradient.
  // token_rows: the N rows are the step's tokens (else one GEMM's rows: s.fp8_quantized).
  void linear_fwd(RefStep<Real>& s, const std::string& linear, int64_t N, int64_t IC, int64_t OC, Real* out,
                  const Real* inp, const ParamInfo* w, const Real* bias, bool token_rows = true) {
    if (!s.bf16(linear)) return linear_forward(N, IC, OC, out, inp, s.p(w), bias);
    const std::vector<Real> wb = rounded(s.p(w), OC * IC);
    if (s.fp8(linear) && s.precision->fp8.fprop) {
      const std::vector<Real> xq =
          s.fp8_quantized(linear, Fp8Role::kInput, Fp8Direction::kRowwise, inp, N, IC, token_rows);
      const std::vector<Real> wq = s.fp8_quantized(linear, Fp8Role::kWeight, Fp8Direction::kRowwise, wb.data(), OC, IC);
      linear_forward(N, IC, OC, out, xq.data(), wq.data(), bias, s.precision->fp8.accumulation);
    } else {
      linear_forward(N, IC, OC, out, inp, wb.data(), bias);
    }
    round_to_bf16(N * OC, out, out);
  }
  void linear_bwd(RefStep<Real>& s, const std::string& linear, int64_t N, int64_t IC, int64_t OC, Real* dinp,
                  const ParamInfo* w, GradOut<Real> dbias, const Real* dout, const Real* inp) {
    linear_dgrad(s, linear, N, IC, OC, dinp, w, dout);
    linear_wgrad(s, linear, N, IC, OC, w, dbias, dout, inp);
  }
  // A linear's backward in its two parts, as the trainer may run them on different rows (a MoE
  // expert: its input gradient per micro-batch, its weight gradient per chunk of tokens).
  // dinp only (none when nullptr):
  void linear_dgrad(RefStep<Real>& s, const std::string& linear, int64_t N, int64_t IC, int64_t OC, Real* dinp,
                    const ParamInfo* w, const Real* dout, bool token_rows = true) {
    if (dinp == nullptr) return;
    if (!s.bf16(linear)) {
      return linear_backward(N, IC, OC, dinp, GradOut<Real>{}, GradOut<Real>{}, dout, static_cast<const Real*>(nullptr),
                             s.p(w));
    }
    const std::vector<Real> wb = rounded(s.p(w), OC * IC), db = rounded(dout, N * OC);
    if (s.fp8(linear) && s.precision->fp8.dgrad) {
      const Fp8Recipe& r = s.precision->fp8;
      const auto dyq = s.fp8_quantized(linear, Fp8Role::kGradOutput, Fp8Direction::kRowwise, db.data(), N, OC, token_rows);
      const auto wq = s.fp8_quantized(linear, Fp8Role::kWeight, Fp8Direction::kColumnwise, wb.data(), OC, IC);
      linear_backward(N, IC, OC, dinp, GradOut<Real>{}, GradOut<Real>{}, dyq.data(), static_cast<const Real*>(nullptr),
                      wq.data(), r.accumulation);
    } else {
      linear_backward(N, IC, OC, dinp, GradOut<Real>{}, GradOut<Real>{}, db.data(), static_cast<const Real*>(nullptr),
                      wb.data());
    }
    round_to_bf16(N * IC, dinp, dinp);
  }
  // The weight's and the bias's gradients only:
  void linear_wgrad(RefStep<Real>& s, const std::string& linear, int64_t N, int64_t IC, int64_t OC, const ParamInfo* w,
                    GradOut<Real> dbias, const Real* dout, const Real* inp, bool token_rows = true) {
    if (!s.bf16(linear)) {
      return linear_backward(N, IC, OC, static_cast<Real*>(nullptr), s.sink(w), dbias, dout, inp, s.p(w));
    }
    const std::vector<Real> db = rounded(dout, N * OC);
    if (!s.fp8(linear)) {
      return linear_backward(N, IC, OC, static_cast<Real*>(nullptr), s.sink(w), dbias, db.data(), inp,
                             static_cast<const Real*>(nullptr));
    }
    const Fp8Recipe& r = s.precision->fp8;
    linear_backward(N, IC, OC, static_cast<Real*>(nullptr), GradOut<Real>{}, dbias, db.data(), inp,
                    static_cast<const Real*>(nullptr));
    if (r.wgrad) {
      const auto dyq =
          s.fp8_quantized(linear, Fp8Role::kGradOutput, Fp8Direction::kColumnwise, db.data(), N, OC, token_rows);
      const auto xq = s.fp8_quantized(linear, Fp8Role::kInput, Fp8Direction::kColumnwise, inp, N, IC, token_rows);
      linear_backward(N, IC, OC, static_cast<Real*>(nullptr), s.sink(w), GradOut<Real>{}, dyq.data(), xq.data(),
                      static_cast<const Real*>(nullptr), r.accumulation);
    } else {
      linear_backward(N, IC, OC, static_cast<Real*>(nullptr), s.sink(w), GradOut<Real>{}, db.data(), inp,
                      static_cast<const Real*>(nullptr));
    }
  }

  LayerDesc d_;

 private:
  static std::vector<Real> rounded(const Real* x, int64_t n) {
    std::vector<Real> out(static_cast<size_t>(n));
    round_to_bf16(n, out.data(), x);
    return out;
  }
};

template <class Real>
class RefEmbedding final : public RefLayer<Real> {
 public:
  RefEmbedding(const LayerDesc& d, int64_t B) : RefLayer<Real>(d), out_(B * d.dims.T * d.dims.C) {}
  Real* output() override { return out_.data(); }
  void forward(RefStep<Real>& s, const Real*) override {
    const LayerDims& m = this->d_.dims;
    embedding_forward(s.B, s.T, m.C, m.V, out_.data(), s.inputs, s.p(s.find(this->n("wte"))),
                      s.p(s.find(this->n("wpe"))));
    s.observe(this->d_.output, out_, {s.B, s.T, m.C});
  }
  void backward(RefStep<Real>& s, const Real*, Real* dout, Real*) override {
    const LayerDims& m = this->d_.dims;
    embedding_backward(s.B, s.T, m.C, m.V, s.sink(s.find(this->n("wte"))), s.sink(s.find(this->n("wpe"))), dout,
                       s.inputs);
  }

 private:
  std::vector<Real> out_;
};

// x1 = x0 + proj(attn(rope(qkv(norm1(x0))))); the RoPE tables the reference's own
// (reference/rope_tables.hpp).
template <class Real>
class RefAttention final : public RefLayer<Real> {
 public:
  RefAttention(const LayerDesc& d, int64_t B) : RefLayer<Real>(d) {
    const LayerDims& m = d.dims;
    if (d.pos == PosKind::kRope) rope_tables(m.T, m.HS, d.rope_theta, rope_cos_, rope_sin_);
    const int64_t BT = B * m.T;
    for (auto* buf : {&ln_, &out_, &res_}) buf->resize(BT * m.C);
    mean_.resize(BT);
    rstd_.resize(BT);
    qkv_.resize(BT * m.qkv_width());
    att_.resize(B * m.NH * m.T * m.T);
  }
  bool residual() const override { return true; }
  Real* output() override { return res_.data(); }

  void forward(RefStep<Real>& s, const Real* x) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), A = m.NH * m.HS;
    const std::string qkv = this->n("attn/qkv"), proj = this->n("attn/proj");
    this->norm_forward(s, ln_.data(), mean_.data(), rstd_.data(), x, param(s, "ln1/weight"), param(s, "ln1/bias"));
    s.store_for(qkv, ln_.data(), BT * m.C);
    s.observe(this->n("ln1/out"), ln_, {s.B, s.T, m.C});
    this->linear_fwd(s, qkv, BT, m.C, m.qkv_width(), qkv_.data(), ln_.data(), param(s, "attn/qkv/weight"),
                     s.p(param(s, "attn/qkv/bias")));
    if (this->d_.pos == PosKind::kRope) {
      rope_forward(s.B, s.T, m.NH, m.NKV, m.HS, qkv_.data(), rope_cos_.data(), rope_sin_.data());
      s.store_for(qkv, qkv_.data(), BT * m.qkv_width());
    }
    s.observe(qkv, qkv_, {s.B, s.T, m.qkv_width()});
    attention_forward(s.B, s.T, m.NH, m.NKV, m.HS, out_.data(), att_.data(), qkv_.data());
    s.observe(this->n("attn/att"), att_, {s.B, m.NH, s.T, s.T});
    s.store_for(proj, out_.data(), BT * A);
    s.observe(this->n("attn/out"), out_, {s.B, s.T, A});
    this->linear_fwd(s, proj, BT, A, m.C, res_.data(), out_.data(), param(s, "attn/proj/weight"),
                     s.p(param(s, "attn/proj/bias")));
    residual_forward(BT * m.C, res_.data(), res_.data(), x);
    s.observe(this->d_.output, res_, {s.B, s.T, m.C});
  }

  void backward(RefStep<Real>& s, const Real* x, Real* dres, Real*) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), A = m.NH * m.HS;
    std::vector<Real> dnorm(BT * m.C), dqkv(BT * m.qkv_width()), dout(BT * A), datt(s.B * m.NH * s.T * s.T);
    this->linear_bwd(s, this->n("attn/proj"), BT, A, m.C, dout.data(), param(s, "attn/proj/weight"),
                     s.sink(param(s, "attn/proj/bias")), dres, out_.data());
    s.observe("grad/" + this->n("attn/out"), dout, {s.B, s.T, A});
    attention_backward(s.B, s.T, m.NH, m.NKV, m.HS, dqkv.data(), datt.data(), dout.data(), qkv_.data(), att_.data());
    s.observe("grad/" + this->n("attn/qkv"), dqkv, {s.B, s.T, m.qkv_width()});
    if (this->d_.pos == PosKind::kRope) {
      rope_backward(s.B, s.T, m.NH, m.NKV, m.HS, dqkv.data(), rope_cos_.data(), rope_sin_.data());
    }
    this->linear_bwd(s, this->n("attn/qkv"), BT, m.C, m.qkv_width(), dnorm.data(), param(s, "attn/qkv/weight"),
                     s.sink(param(s, "attn/qkv/bias")), dqkv.data(), ln_.data());
    s.observe("grad/" + this->n("ln1/out"), dnorm, {s.B, s.T, m.C});
    this->norm_backward(s, dres, dnorm.data(), x, mean_.data(), rstd_.data(), param(s, "ln1/weight"),
                        param(s, "ln1/bias"));
    s.observe("grad/" + this->d_.input, dres, {s.B, s.T, m.C});
  }

 private:
  const ParamInfo* param(const RefStep<Real>& s, const char* local) const { return s.find(this->n(local)); }
  std::vector<Real> rope_cos_, rope_sin_;
  std::vector<Real> ln_, mean_, rstd_, qkv_, att_, out_, res_;
};

// x2 = x1 + proj(act(fc(norm2(x1)))).
template <class Real>
class RefMlp final : public RefLayer<Real> {
 public:
  RefMlp(const LayerDesc& d, int64_t B) : RefLayer<Real>(d) {
    const LayerDims& m = d.dims;
    const int64_t BT = B * m.T;
    ln_.resize(BT * m.C);
    res_.resize(BT * m.C);
    mean_.resize(BT);
    rstd_.resize(BT);
    fc_.resize(BT * fc_out());
    act_.resize(BT * m.F);
  }
  bool residual() const override { return true; }
  Real* output() override { return res_.data(); }

  void forward(RefStep<Real>& s, const Real* x) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT();
    const std::string fc = this->n("mlp/fc"), proj = this->n("mlp/proj");
    this->norm_forward(s, ln_.data(), mean_.data(), rstd_.data(), x, param(s, "ln2/weight"), param(s, "ln2/bias"));
    s.store_for(fc, ln_.data(), BT * m.C);
    s.observe(this->n("ln2/out"), ln_, {s.B, s.T, m.C});
    this->linear_fwd(s, fc, BT, m.C, fc_out(), fc_.data(), ln_.data(), param(s, "mlp/fc/weight"),
                     s.p(param(s, "mlp/fc/bias")));
    s.observe(this->n("mlp/fc"), fc_, {s.B, s.T, fc_out()});
    if (this->d_.ffn == FfnKind::kSwiglu) {
      swiglu_forward(BT, m.F, act_.data(), fc_.data());
    } else {
      gelu_forward(BT * m.F, act_.data(), fc_.data());
    }
    s.store_for(proj, act_.data(), BT * m.F);
    s.observe(this->n("mlp/act"), act_, {s.B, s.T, m.F});
    this->linear_fwd(s, proj, BT, m.F, m.C, res_.data(), act_.data(), param(s, "mlp/proj/weight"),
                     s.p(param(s, "mlp/proj/bias")));
    residual_forward(BT * m.C, res_.data(), res_.data(), x);
    s.observe(this->d_.output, res_, {s.B, s.T, m.C});
  }

  void backward(RefStep<Real>& s, const Real* x, Real* dres, Real*) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT();
    std::vector<Real> dnorm(BT * m.C), dfc(BT * fc_out()), dact(BT * m.F);
    this->linear_bwd(s, this->n("mlp/proj"), BT, m.F, m.C, dact.data(), param(s, "mlp/proj/weight"),
                     s.sink(param(s, "mlp/proj/bias")), dres, act_.data());
    s.observe("grad/" + this->n("mlp/act"), dact, {s.B, s.T, m.F});
    if (this->d_.ffn == FfnKind::kSwiglu) {
      swiglu_backward(BT, m.F, dfc.data(), fc_.data(), dact.data());
    } else {
      gelu_backward(BT * m.F, dfc.data(), fc_.data(), dact.data());
    }
    s.observe("grad/" + this->n("mlp/fc"), dfc, {s.B, s.T, fc_out()});
    this->linear_bwd(s, this->n("mlp/fc"), BT, m.C, fc_out(), dnorm.data(), param(s, "mlp/fc/weight"),
                     s.sink(param(s, "mlp/fc/bias")), dfc.data(), ln_.data());
    s.observe("grad/" + this->n("ln2/out"), dnorm, {s.B, s.T, m.C});
    this->norm_backward(s, dres, dnorm.data(), x, mean_.data(), rstd_.data(), param(s, "ln2/weight"),
                        param(s, "ln2/bias"));
    s.observe("grad/" + this->d_.input, dres, {s.B, s.T, m.C});
  }

 private:
  int64_t fc_out() const { return this->d_.ffn == FfnKind::kSwiglu ? 2 * this->d_.dims.F : this->d_.dims.F; }
  const ParamInfo* param(const RefStep<Real>& s, const char* local) const { return s.find(this->n(local)); }
  std::vector<Real> ln_, mean_, rstd_, fc_, act_, res_;
};

template <class Real>
class RefFinalNorm final : public RefLayer<Real> {
 public:
  RefFinalNorm(const LayerDesc& d, int64_t B) : RefLayer<Real>(d) {
    out_.resize(B * d.dims.T * d.dims.C);
    mean_.resize(B * d.dims.T);
    rstd_.resize(B * d.dims.T);
  }
  Real* output() override { return out_.data(); }
  void forward(RefStep<Real>& s, const Real* x) override {
    this->norm_forward(s, out_.data(), mean_.data(), rstd_.data(), x, s.find(this->n("lnf/weight")),
                       s.find(this->n("lnf/bias")));
    s.store_for(kHeadLinear, out_.data(), s.BT() * this->d_.dims.C);
    s.observe(this->d_.output, out_, {s.B, s.T, this->d_.dims.C});
  }
  void backward(RefStep<Real>& s, const Real* x, Real* dout, Real* dinp) override {
    std::fill(dinp, dinp + s.BT() * this->d_.dims.C, Real(0));
    this->norm_backward(s, dinp, dout, x, mean_.data(), rstd_.data(), s.find(this->n("lnf/weight")),
                        s.find(this->n("lnf/bias")));
    s.observe("grad/" + this->d_.input, dinp, {s.B, s.T, this->d_.dims.C});
  }

 private:
  std::vector<Real> out_, mean_, rstd_;
};

// logits = x · headᵀ (wte when tied); the mean cross-entropy over the batch: the one sum whose
// chunks restart at each micro-batch (the trainer adds each micro-batch's losses), so its segments
// are an input.
template <class Real>
class RefHead final : public RefLayer<Real> {
 public:
  RefHead(const LayerDesc& d, int64_t B) : RefLayer<Real>(d) {
    logits_.resize(B * d.dims.T * d.dims.V);
    losses_.resize(B * d.dims.T);
  }
  Real* output() override { return logits_.data(); }
  void forward(RefStep<Real>& s, const Real* x) override {
    const LayerDims& m = this->d_.dims;
    this->linear_fwd(s, kHeadLinear, s.BT(), m.C, m.V, logits_.data(), x, head(s), static_cast<Real*>(nullptr));
    s.observe(this->d_.output, logits_, {s.B, s.T, m.V});
    if (!s.eval) return;
    crossentropy_forward(s.BT(), m.V, losses_.data(), logits_.data(), s.targets);
    s.loss = sum(losses_.data(), 1, s.BT()) / Real(static_cast<float>(s.BT()));
  }
  void backward(RefStep<Real>& s, const Real* x, Real*, Real* dinp) override {
    const LayerDims& m = this->d_.dims;
    crossentropy_forward_backward(s.BT(), m.V, s.dloss, losses_.data(), logits_.data(), s.targets);
    s.observe(this->n("losses"), losses_, {s.B, s.T});
    s.observe("grad/" + this->d_.output, logits_, {s.B, s.T, m.V});
    s.loss = sum_segments(losses_.data(), s.loss_segments) / Real(static_cast<float>(s.BT()));
    this->linear_bwd(s, kHeadLinear, s.BT(), m.C, m.V, dinp, head(s), GradOut<Real>{}, logits_.data(), x);
    s.observe("grad/" + this->d_.input, dinp, {s.B, s.T, m.C});
  }

 private:
  const ParamInfo* head(const RefStep<Real>& s) const {
    return s.find(this->d_.tied ? std::string("wte") : this->n("lm_head/weight"));
  }
  std::vector<Real> logits_, losses_;
};

// x2 = x1 + Σ_j gate_j · expert_j(norm2(x1)) (src/model/layers/moe.cpp). The choice of experts is
// made in fp32 from the logits as the layer has them (the trainer's own values where verify step
// anchors the reference on them): the router op's contract is the same in both modes, so
// CanonicalF32 on those logits reproduces the trainer's choice. Rows as src/model/moe_routing.hpp
// assigns them (capacity per sequence, token order); an expert's linears run on the rows the
// layer gives them in one call — a micro-batch's, and for the weight gradients in canonical mode
// a chunk's of the step's tokens — since fp8 quantizes each call's operands as a whole.
template <class Real>
class RefMoe final : public RefLayer<Real> {
 public:
  RefMoe(const LayerDesc& d, int64_t B) : RefLayer<Real>(d) {
    const LayerDims& m = d.dims;
    const int64_t BT = B * m.T;
    ln_.resize(BT * m.C);
    res_.resize(BT * m.C);
    mean_.resize(BT);
    rstd_.resize(BT);
    logits_.resize(BT * d.experts);
    probs_.resize(BT * d.experts);
    gates_.resize(BT * d.top_k);
  }
  bool residual() const override { return true; }
  Real* output() override { return res_.data(); }

  void forward(RefStep<Real>& s, const Real* x) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), E = this->d_.experts, K = this->d_.top_k;
    this->norm_forward(s, ln_.data(), mean_.data(), rstd_.data(), x, param(s, "ln2/weight"), param(s, "ln2/bias"));
    s.observe(this->n("ln2/out"), ln_, {s.B, s.T, m.C});
    linear_forward(BT, m.C, E, logits_.data(), ln_.data(), s.p(param(s, "moe/router/weight")), static_cast<Real*>(nullptr));
    s.observe(this->n("moe/router"), logits_, {s.B, s.T, E});
    route(s);
    router_forward(dims(s), probs_.data(), gates_.data(), logits_.data(), experts_.data());
    // Each expert's rows (its tokens in order), through its MLP.
    xe_.assign(static_cast<size_t>(rows_total_ * m.C), Real(0));
    fc_.assign(static_cast<size_t>(rows_total_ * fc_out()), Real(0));
    act_.assign(static_cast<size_t>(rows_total_ * m.F), Real(0));
    y_.assign(static_cast<size_t>(rows_total_ * m.C), Real(0));
    for (int64_t r = 0; r < rows_total_; ++r)
      for (int64_t c = 0; c < m.C; ++c) xe_[r * m.C + c] = ln_[token_of_row_[r] * m.C + c];
    // The trainer runs each expert's linears on its rows of one micro-batch at a time.
    for (int64_t e = 0; e < E; ++e) {
      const std::string fc = expert(e, "fc"), proj = expert(e, "proj");
      runs(e, micro_batch_of(s), [&](int64_t f, int64_t n) {
        s.store_for(fc, xe_.data() + f * m.C, n * m.C);
        this->linear_fwd(s, fc, n, m.C, fc_out(), fc_.data() + f * fc_out(), xe_.data() + f * m.C,
                         s.find(fc + "/weight"), s.p(s.find(fc + "/bias")), false);
        if (this->d_.ffn == FfnKind::kSwiglu) {
          swiglu_forward(n, m.F, act_.data() + f * m.F, fc_.data() + f * fc_out());
        } else {
          gelu_forward(n * m.F, act_.data() + f * m.F, fc_.data() + f * fc_out());
        }
        s.store_for(proj, act_.data() + f * m.F, n * m.F);
        this->linear_fwd(s, proj, n, m.F, m.C, y_.data() + f * m.C, act_.data() + f * m.F, s.find(proj + "/weight"),
                         s.p(s.find(proj + "/bias")), false);
      });
    }
    if (this->d_.shared_F > 0) shared_forward(s);
    moe_combine_forward(BT, m.C, K, res_.data(), y_.data(), rows_.data(), gates_.data());
    if (this->d_.shared_F > 0) residual_forward(BT * m.C, res_.data(), res_.data(), shared_y_.data());
    residual_forward(BT * m.C, res_.data(), res_.data(), x);
    s.observe(this->d_.output, res_, {s.B, s.T, m.C});
  }

  void backward(RefStep<Real>& s, const Real* x, Real* dres, Real*) override {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), E = this->d_.experts, K = this->d_.top_k;
    std::vector<Real> dy(y_.size(), Real(0)), dgates(gates_.size()), dact(act_.size()), dfc(fc_.size()),
        dxe(xe_.size()), dlogits(logits_.size()), dnorm(BT * m.C), dshared(BT * m.C);
    if (this->d_.shared_F > 0) shared_backward(s, dres, dshared.data());
    moe_combine_backward(BT, m.C, K, dy.data(), dgates.data(), dres, y_.data(), rows_.data(), gates_.data());
    // The trainer's expert backward: the input gradient on one micro-batch's rows at a time, the
    // weight gradients on the rows of each chunk of the step's tokens (canonical) or of each
    // micro-batch (fast).
    for (int64_t e = E - 1; e >= 0; --e) {
      const std::string fc = expert(e, "fc"), proj = expert(e, "proj");
      const ParamInfo *fc_w = s.find(fc + "/weight"), *proj_w = s.find(proj + "/weight");
      runs(e, micro_batch_of(s), [&](int64_t r0, int64_t n) {
        this->linear_dgrad(s, proj, n, m.F, m.C, dact.data() + r0 * m.F, proj_w, dy.data() + r0 * m.C, false);
      });
      runs(e, weight_grad_window(s, proj), [&](int64_t r0, int64_t n) {
        this->linear_wgrad(s, proj, n, m.F, m.C, proj_w, s.sink(s.find(proj + "/bias")), dy.data() + r0 * m.C,
                           act_.data() + r0 * m.F, false);
      });
      const int64_t f = first_[e], n = first_[e + 1] - f;
      if (this->d_.ffn == FfnKind::kSwiglu) {
        swiglu_backward(n, m.F, dfc.data() + f * fc_out(), fc_.data() + f * fc_out(), dact.data() + f * m.F);
      } else {
        gelu_backward(n * m.F, dfc.data() + f * fc_out(), fc_.data() + f * fc_out(), dact.data() + f * m.F);
      }
      runs(e, micro_batch_of(s), [&](int64_t r0, int64_t n) {
        this->linear_dgrad(s, fc, n, m.C, fc_out(), dxe.data() + r0 * m.C, fc_w, dfc.data() + r0 * fc_out(), false);
      });
      runs(e, weight_grad_window(s, fc), [&](int64_t r0, int64_t n) {
        this->linear_wgrad(s, fc, n, m.C, fc_out(), fc_w, s.sink(s.find(fc + "/bias")), dfc.data() + r0 * fc_out(),
                           xe_.data() + r0 * m.C, false);
      });
    }
    std::vector<Real> aux(static_cast<size_t>(s.B)), daux(static_cast<size_t>(s.B * E)), mean_probs(daux.size());
    const bool balancing = this->d_.aux_weight > 0;
    if (balancing) {
      moe_aux_loss(dims(s), this->d_.aux_weight, value_f32(s.dloss), aux.data(), daux.data(), mean_probs.data(),
                   probs_.data(), experts_.data());
    }
    router_backward(dims(s), dlogits.data(), probs_.data(), experts_.data(), gates_.data(), dgates.data(),
                    balancing ? daux.data() : static_cast<Real*>(nullptr));
    linear_backward(BT, m.C, E, dnorm.data(), s.sink(param(s, "moe/router/weight")), GradOut<Real>{}, dlogits.data(),
                    ln_.data(), s.p(param(s, "moe/router/weight")));
    moe_dispatch_backward(BT, m.C, K, dnorm.data(), dxe.data(), rows_.data());
    if (this->d_.shared_F > 0) residual_forward(BT * m.C, dnorm.data(), dnorm.data(), dshared.data());
    s.observe("grad/" + this->n("ln2/out"), dnorm, {s.B, s.T, m.C});
    this->norm_backward(s, dres, dnorm.data(), x, mean_.data(), rstd_.data(), param(s, "ln2/weight"),
                        param(s, "ln2/bias"));
    s.observe("grad/" + this->d_.input, dres, {s.B, s.T, m.C});
  }

 private:
  int64_t ffn_width(int64_t F) const { return this->d_.ffn == FfnKind::kSwiglu ? 2 * F : F; }
  int64_t fc_out() const { return ffn_width(this->d_.dims.F); }
  const ParamInfo* param(const RefStep<Real>& s, const char* local) const { return s.find(this->n(local)); }
  std::string expert(int64_t e, const char* linear) const {
    return this->n("moe/expert/" + std::to_string(e) + "/" + linear);
  }
  RouterDims dims(const RefStep<Real>& s) const {
    return {s.BT(), this->d_.experts, this->d_.top_k, this->d_.router == RouterKind::kSoftmax, this->d_.normalize_gates,
            s.T};
  }
  static float value_f32(const Real& x) { return static_cast<float>(value_of(x)); }

  // The shared experts: one MLP of shared_F features over every token (its fc reads the norm's
  // output in its own precision; the router the fp32 one).
  void shared_forward(RefStep<Real>& s) {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), FS = this->d_.shared_F, fc_out = ffn_width(FS);
    const std::string fc = this->n("moe/shared/fc"), proj = this->n("moe/shared/proj");
    shared_in_ = ln_;
    s.store_for(fc, shared_in_.data(), BT * m.C);
    shared_fc_.assign(static_cast<size_t>(BT * fc_out), Real(0));
    shared_act_.assign(static_cast<size_t>(BT * FS), Real(0));
    shared_y_.assign(static_cast<size_t>(BT * m.C), Real(0));
    this->linear_fwd(s, fc, BT, m.C, fc_out, shared_fc_.data(), shared_in_.data(), s.find(fc + "/weight"),
                     s.p(s.find(fc + "/bias")));
    if (this->d_.ffn == FfnKind::kSwiglu) {
      swiglu_forward(BT, FS, shared_act_.data(), shared_fc_.data());
    } else {
      gelu_forward(BT * FS, shared_act_.data(), shared_fc_.data());
    }
    s.store_for(proj, shared_act_.data(), BT * FS);
    this->linear_fwd(s, proj, BT, FS, m.C, shared_y_.data(), shared_act_.data(), s.find(proj + "/weight"),
                     s.p(s.find(proj + "/bias")));
  }
  void shared_backward(RefStep<Real>& s, const Real* dres, Real* dshared) {
    const LayerDims& m = this->d_.dims;
    const int64_t BT = s.BT(), FS = this->d_.shared_F, fc_out = ffn_width(FS);
    const std::string fc = this->n("moe/shared/fc"), proj = this->n("moe/shared/proj");
    std::vector<Real> dact(static_cast<size_t>(BT * FS)), dfc(static_cast<size_t>(BT * fc_out));
    this->linear_bwd(s, proj, BT, FS, m.C, dact.data(), s.find(proj + "/weight"), s.sink(s.find(proj + "/bias")), dres,
                     shared_act_.data());
    if (this->d_.ffn == FfnKind::kSwiglu) {
      swiglu_backward(BT, FS, dfc.data(), shared_fc_.data(), dact.data());
    } else {
      gelu_backward(BT * FS, dfc.data(), shared_fc_.data(), dact.data());
    }
    this->linear_bwd(s, fc, BT, m.C, fc_out, dshared, s.find(fc + "/weight"), s.sink(s.find(fc + "/bias")), dfc.data(),
                     shared_in_.data());
  }

  // The choice (from the fp32 logits), then the rows: per sequence each expert keeps its first
  // `capacity` choices in token order (all when dropless), expert-major in token order.
  void route(const RefStep<Real>& s) {
    const int64_t BT = s.BT(), E = this->d_.experts, K = this->d_.top_k, T = s.T;
    std::vector<CanonicalF32> logits(logits_.size()), probs(logits_.size()), gates(gates_.size());
    for (size_t i = 0; i < logits_.size(); ++i) logits[i] = value_f32(logits_[i]);
    const std::vector<int32_t> none(gates_.size(), 0);
    router_forward(dims(s), probs.data(), gates.data(), logits.data(), none.data());
    // The selection score: the probability, plus (aux-loss-free balancing) the expert's bias in one
    // fp32 add (kernels/ops/moe.hpp).
    const std::vector<float>* bias = nullptr;
    if (this->d_.selection_bias) bias = &s.selection_biases->at(this->d_.prefix + "moe");
    experts_.clear();
    for (int64_t n = 0; n < BT; ++n) {
      std::vector<float> p(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) p[e] = bias != nullptr ? probs[n * E + e].v + (*bias)[e] : probs[n * E + e].v;
      for (int32_t e : top_k(p.data(), E, K)) experts_.push_back(e);
    }
    const double factor = this->d_.capacity_factor;
    const int64_t capacity =
        factor == 0 ? 0 : static_cast<int64_t>(std::ceil(factor * static_cast<double>(T * K) / static_cast<double>(E)));
    rows_.assign(static_cast<size_t>(BT * K), -1);
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(E));  // each expert's choices (n·K + j)
    for (int64_t g = 0; g < BT; g += T) {
      std::vector<int64_t> in_group(static_cast<size_t>(E), 0);
      for (int64_t i = g * K; i < (g + T) * K; ++i) {
        const int32_t e = experts_[i];
        if (capacity > 0 && in_group[e] >= capacity) continue;
        ++in_group[e];
        kept[e].push_back(i);
      }
    }
    first_.assign(static_cast<size_t>(E + 1), 0);
    token_of_row_.clear();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i : kept[e]) {
        rows_[i] = static_cast<int32_t>(token_of_row_.size());
        token_of_row_.push_back(i / K);
      }
      first_[e + 1] = static_cast<int64_t>(token_of_row_.size());
    }
    rows_total_ = static_cast<int64_t>(token_of_row_.size());
  }
  // f(first row, rows) for each run of expert e's rows whose tokens lie in one window
  // (window(token): the same number for the tokens of one window).
  template <class W, class F>
  void runs(int64_t e, W&& window, F&& f) const {
    for (int64_t r = first_[e]; r < first_[e + 1];) {
      const int64_t w = window(token_of_row_[r]);
      int64_t t = r + 1;
      while (t < first_[e + 1] && window(token_of_row_[t]) == w) ++t;
      f(r, t - r);
      r = t;
    }
  }
  // The trainer's micro-batch of a token (loss_segments: their token boundaries).
  static auto micro_batch_of(const RefStep<Real>& s) {
    return [&s](int64_t token) {
      return static_cast<int64_t>(std::upper_bound(s.loss_segments.begin(), s.loss_segments.end(), token) -
                                  s.loss_segments.begin());
    };
  }
  // The rows linear's weight gradient sums in one call: a chunk of the step's tokens (64, or the
  // precision's unit: fp8 under Hopper accumulation) in canonical mode, a micro-batch in fast mode.
  static std::function<int64_t(int64_t)> weight_grad_window(const RefStep<Real>& s, const std::string& linear) {
    if (!std::is_same_v<Real, CanonicalF32>) return micro_batch_of(s);
    const int64_t unit = s.precision != nullptr ? s.precision->weight_grad_chunk(linear) : kCanonicalChunk;
    return [unit](int64_t token) { return token / unit; };
  }

  std::vector<Real> ln_, mean_, rstd_, logits_, probs_, gates_, xe_, fc_, act_, y_, res_;
  std::vector<Real> shared_in_, shared_fc_, shared_act_, shared_y_;
  std::vector<int32_t> experts_, rows_;
  std::vector<int64_t> token_of_row_, first_;
  int64_t rows_total_ = 0;
};

// The reference layer of a description entry. A new layer kind adds its class above and a case here.
template <class Real>
std::unique_ptr<RefLayer<Real>> make_ref_layer(const LayerDesc& d, int64_t B) {
  switch (d.kind) {
    case LayerKind::kEmbedding: return std::make_unique<RefEmbedding<Real>>(d, B);
    case LayerKind::kAttention: return std::make_unique<RefAttention<Real>>(d, B);
    case LayerKind::kMlp: return std::make_unique<RefMlp<Real>>(d, B);
    case LayerKind::kFinalNorm: return std::make_unique<RefFinalNorm<Real>>(d, B);
    case LayerKind::kHead: return std::make_unique<RefHead<Real>>(d, B);
    case LayerKind::kMoe: return std::make_unique<RefMoe<Real>>(d, B);
  }
  return nullptr;
}

}  // namespace lockstep::reference
