// The MLP sub-layer of a pre-norm block: x2 = x1 + proj(act(fc(norm2(x1)))).
//   ln2/out   norm of the stream                                    (B, T, C)
//   mlp/fc    the hidden pre-activations (SwiGLU: [gate | up])      (B, T, F or 2F)
//   mlp/act   GELU (tanh form) or SwiGLU                            (B, T, F)
//   mlp/res   the stream plus the projection                        (B, T, C)
// Each block may have its own hidden width F (its LayerDesc's dims). Tensor parallelism splits the
// hidden features: fc column-parallel (SwiGLU: the same rows of both halves), proj row-parallel.
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

int64_t fc_width(const LayerDesc& d, int64_t F) { return d.ffn == FfnKind::kSwiglu ? 2 * F : F; }

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  const std::string& pre = d.prefix;
  // SwiGLU's fc rows are [gate | up]: a rank holds the same features of both.
  const std::vector<int64_t> fc_segments =
      d.ffn == FfnKind::kSwiglu ? std::vector<int64_t>{m.F, m.F} : std::vector<int64_t>{m.F};
  d.output = pre + "mlp/res";
  d.params.push_back({.name = pre + "ln2/weight", .shape = {m.C}, .norm = true, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "ln2/bias", .shape = {m.C}, .norm = true, .init = ParamInit::kZeros});
  }
  d.params.push_back({.name = pre + "mlp/fc/weight", .shape = {fc_width(d, m.F), m.C}, .decay = true, .matmul = true, .split_dim = 0,
                      .segments = fc_segments});
  if (d.bias) {
    d.params.push_back({.name = pre + "mlp/fc/bias", .shape = {fc_width(d, m.F)}, .init = ParamInit::kZeros,
                        .split_dim = 0, .segments = fc_segments});
  }
  d.params.push_back({.name = pre + "mlp/proj/weight", .shape = {m.C, m.F}, .decay = true, .matmul = true,
                      .init_scale = d.residual_scale, .split_dim = 1, .segments = {m.F}});
  if (d.bias) d.params.push_back({.name = pre + "mlp/proj/bias", .shape = {m.C}, .init = ParamInit::kZeros});

  const std::string ln = pre + "ln2/out", fc = pre + "mlp/fc", act = pre + "mlp/act";
  d.hooks.push_back({.name = ln, .region = HookRegion::kNormOut, .op_site = true});
  d.hooks.push_back({.name = fc, .region = HookRegion::kSplit, .split_dim = 2, .segments = fc_segments, .op_site = true});
  d.hooks.push_back({.name = act, .region = HookRegion::kSplit, .split_dim = 2, .segments = {m.F}, .op_site = true});
  d.hooks.push_back({.name = d.output, .region = HookRegion::kStream, .op_site = true});

  const std::string g = "grad/";
  d.ops = {
      {ln, "norm (ln2)", {d.input}, "ln2 weights"},
      {fc, "linear (mlp fc)", {ln}, "fc weight and bias"},
      {act, "activation", {fc}, ""},
      {d.output, "linear (mlp proj) + residual", {act, d.input}, "mlp proj weight and bias"},
      {g + act, "linear backward (mlp proj, input gradient)", {g + d.output}, "mlp proj weight"},
      {g + fc, "activation backward", {g + act, fc}, ""},
      {g + ln, "linear backward (mlp fc, input gradient)", {g + fc}, "fc weight"},
      {g + d.input, "norm backward (ln2) + residual", {g + ln, d.input, g + d.output}, "ln2 weights"},
  };
}

class Mlp final : public Layer {
 public:
  Mlp(const LayerDesc& desc, const LayerBuild& b)
      : Layer(desc),
        m_(b.local),
        fc_out_(fc_width(desc, m_.F)),
        norm_(b.ctx.plan().norm(this->desc())),
        ln_w_(b.ctx.find_param(name("ln2/weight"))),
        ln_b_(b.ctx.find_param(name("ln2/bias"))),
        fc_w_(b.ctx.find_param(name("mlp/fc/weight"))),
        fc_b_(b.ctx.find_param(name("mlp/fc/bias"))),
        proj_w_(b.ctx.find_param(name("mlp/proj/weight"))),
        proj_b_(b.ctx.find_param(name("mlp/proj/bias"))),
        fc_(b.ctx.plan().linear(this->desc(), *fc_w_)),
        proj_(b.ctx.plan().linear(this->desc(), *proj_w_)),
        ln_name_(name("ln2/out")),
        fc_name_(name("mlp/fc")),
        act_name_(name("mlp/act")),
        res_name_(desc.output),
        grad_ln_name_("grad/" + ln_name_),
        grad_fc_name_("grad/" + fc_name_),
        grad_act_name_("grad/" + act_name_),
        grad_in_name_("grad/" + desc.input) {
    const int64_t BT = b.max_batch * m_.T, RS = b.max_stream, C = m_.C;
    acts_.resize(static_cast<size_t>(b.slots));
    for (auto& a : acts_) {
      a.ln.resize(BT * C);
      a.mean.resize(RS);
      a.rstd.resize(RS);
      a.fc.resize(BT * fc_out_);
      a.act.resize(BT * m_.F);
      a.res.resize(RS * C);
    }
    scratch_ = RS * C + BT * fc_out_ + BT * m_.F;
  }

  bool residual() const override { return true; }
  int64_t scratch_floats() const override { return scratch_; }
  const float* output(int slot) const override { return acts_[static_cast<size_t>(slot)].res.data(); }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    const int64_t C = m_.C, BT = p.BT, F = m_.F;
    norm_->forward(ctx.backend(), ctx.mode_of(ln_name_), BT, a.ln.data(), a.mean.data(), a.rstd.data(), x, ctx.param(ln_w_),
                   ctx.param(ln_b_));
    ctx.observe(ln_name_, a.ln.data(), {p.B, p.T, C});
    fc_->forward(ctx.backend(), ctx.mode_of(fc_name_), {BT, C, fc_out_}, a.fc.data(), a.ln.data(), ctx.param(fc_w_),
                 ctx.param(fc_b_));
    ctx.observe(fc_name_, a.fc.data(), {p.B, p.T, fc_out_});
    if (desc().ffn == FfnKind::kGelu) {
      ctx.backend().gelu_forward(ctx.mode_of(act_name_), BT * F, a.act.data(), a.fc.data());
    } else {
      ctx.backend().swiglu_forward(ctx.mode_of(act_name_), BT, F, a.act.data(), a.fc.data());
    }
    ctx.observe(act_name_, a.act.data(), {p.B, p.T, F});
    proj_->forward(ctx.backend(), ctx.mode_of(res_name_), {BT, F, C}, a.res.data(), a.act.data(), ctx.param(proj_w_),
                   ctx.param(proj_b_));
    ctx.backend().residual_forward(p.RS * C, a.res.data(), a.res.data(), x);
    ctx.observe(res_name_, a.res.data(), {p.RB, p.RT, C});
  }

  // dres: d(x2) in, d(x1) out (the stream gradient, in place).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float*) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    const Mode mode = ctx.mode();
    const int64_t C = m_.C, BT = p.BT, F = m_.F;
    float* dnorm = ctx.scratch();        // (stream tokens, C)
    float* dfc = dnorm + p.RS * C;       // (BT, fc_out)
    float* dact = dfc + BT * fc_out_;    // (BT, F)
    proj_->backward(ctx.backend(), mode, {BT, F, C}, p.token_offset, dact, ctx.sink(proj_w_), ctx.sink(proj_b_), dres,
                    a.act.data(), ctx.param(proj_w_));
    ctx.grads_ready(p, proj_w_, proj_b_);
    ctx.observe(grad_act_name_, dact, {p.B, p.T, F});
    if (desc().ffn == FfnKind::kGelu) {
      ctx.backend().gelu_backward(mode, BT * F, dfc, a.fc.data(), dact);
    } else {
      ctx.backend().swiglu_backward(mode, BT, F, dfc, a.fc.data(), dact);
    }
    ctx.observe(grad_fc_name_, dfc, {p.B, p.T, fc_out_});
    fc_->backward(ctx.backend(), mode, {BT, C, fc_out_}, p.token_offset, dnorm, ctx.sink(fc_w_), ctx.sink(fc_b_), dfc, a.ln.data(),
                  ctx.param(fc_w_));
    ctx.grads_ready(p, fc_w_, fc_b_);
    ctx.observe(grad_ln_name_, dnorm, {p.RB, p.RT, C});
    norm_backward_rows(ctx.backend(), desc(), mode, p.RS, p.stream_offset, dres, ctx.sink(ln_w_), ctx.sink(ln_b_), dnorm, x,
                       ctx.param(ln_w_), a.mean.data(), a.rstd.data());
    ctx.grads_ready(p, ln_w_, ln_b_);
    ctx.observe(grad_in_name_, dres, {p.RB, p.RT, C});
  }

 private:
  struct Acts {
    std::vector<float> ln, mean, rstd, fc, act, res;
  };

  LayerDims m_;
  int64_t fc_out_;
  std::unique_ptr<NormOp> norm_;
  const ParamTensor *ln_w_, *ln_b_, *fc_w_, *fc_b_, *proj_w_, *proj_b_;
  std::unique_ptr<LinearOp> fc_, proj_;
  std::string ln_name_, fc_name_, act_name_, res_name_;
  std::string grad_ln_name_, grad_fc_name_, grad_act_name_, grad_in_name_;
  std::vector<Acts> acts_;
  int64_t scratch_ = 0;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Mlp>(desc, b); }

}  // namespace

const LayerType kMlpLayer = {LayerKind::kMlp, "mlp", declare, build};

}  // namespace lockstep
