// The MLP sub-layer of a pre-norm block: x2 = x1 + proj(act(fc(norm2(x1)))).
//   ln2/out   norm of the stream                                    (B, T, C)
//   mlp/fc    the hidden pre-activations (SwiGLU: [gate | up])      (B, T, F or 2F)
//   mlp/act   GELU (tanh form) or SwiGLU                            (B, T, F)
//   mlp/res   the stream plus the projection                        (B, T, C)
// Each block may have its own hidden width F (its LayerDesc's dims). Tensor parallelism splits the
// hidden features: fc column-parallel (SwiGLU: the same rows of both halves), proj row-parallel.
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/layers/residual_branch.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  const std::string& pre = d.prefix;
  const std::vector<int64_t> fc_segments = ffn_fc_segments(d, m.F);
  d.output = pre + "mlp/res";
  d.params.push_back({.name = pre + "ln2/weight", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "ln2/bias", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kZeros});
  }
  d.params.push_back({.name = pre + "mlp/fc/weight", .shape = {ffn_fc_width(d, m.F), m.C}, .klass = ParamClass::kMatrix, .matmul = true, .split_dim = 0,
                      .segments = fc_segments});
  if (d.bias) {
    d.params.push_back({.name = pre + "mlp/fc/bias", .shape = {ffn_fc_width(d, m.F)}, .klass = ParamClass::kBias, .init = ParamInit::kZeros,
                        .split_dim = 0, .segments = fc_segments});
  }
  d.params.push_back({.name = pre + "mlp/proj/weight", .shape = {m.C, m.F}, .klass = ParamClass::kMatrix, .matmul = true,
                      .init_scale = d.residual_scale, .split_dim = 1, .segments = {m.F}});
  if (d.bias) d.params.push_back({.name = pre + "mlp/proj/bias", .shape = {m.C}, .klass = ParamClass::kBias, .init = ParamInit::kZeros});

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

class Mlp final : public ResidualBranch {
 public:
  Mlp(const LayerDesc& desc, const LayerBuild& b)
      : ResidualBranch(desc, b, "ln2", "mlp/fc", "mlp/proj", ffn_fc_width(desc, b.local.F)),
        F_(b.local.F),
        fc_out_(ffn_fc_width(desc, F_)),
        fc_name_(name("mlp/fc")),
        act_name_(name("mlp/act")),
        grad_fc_name_("grad/" + fc_name_),
        grad_act_name_("grad/" + act_name_),
        acts_(b.ctx, LayerKind::kMlp, "mlp", b.slots, [&](Acts& a) {
          const int64_t BT = b.max_tokens;
          grow_to(a.fc, BT * fc_out_);
          grow_to(a.act, BT * F_);
        }) {
    const int64_t BT = b.max_tokens;
    scratch_ = b.max_stream * C_ + BT * fc_out_ + BT * F_;
  }

  int64_t scratch_floats() const override { return scratch_; }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    norm_forward(ctx, p, x);
    in_->forward(be, ctx.mode_of(fc_name_), {p.BT, C_, fc_out_}, a.fc.data(), slot(p).ln.data(),
                 ctx.linear_weight(in_w_, in_linear_), ctx.param(in_b_));
    ctx.observe(fc_name_, a.fc.data(), {p.B, p.T, fc_out_});
    activation_forward_rows(be, desc(), ctx.mode_of(act_name_), p.BT, F_, a.act.data(), a.fc.data());
    ctx.store_for(out_linear_, a.act.data(), p.BT * F_);
    ctx.observe(act_name_, a.act.data(), {p.B, p.T, F_});
    out_forward(ctx, p, x, a.act.data(), F_);
  }

  // dres: d(x2) in, d(x1) out (the stream gradient, in place).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float*) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    float* dnorm = ctx.scratch();        // (stream tokens, C)
    float* dfc = dnorm + p.RS * C_;      // (BT, fc_out)
    float* dact = dfc + p.BT * fc_out_;  // (BT, F)
    out_backward(ctx, p, dres, dact, a.act.data(), F_);
    ctx.observe(grad_act_name_, dact, {p.B, p.T, F_});
    activation_backward_rows(be, desc(), ctx.mode(), p.BT, F_, dfc, a.fc.data(), dact);
    ctx.observe(grad_fc_name_, dfc, {p.B, p.T, fc_out_});
    in_norm_backward(ctx, p, x, dres, dnorm, dfc, fc_out_);
  }

 private:
  struct Acts {
    std::vector<float> fc, act;
  };

  int64_t F_, fc_out_;
  std::string fc_name_, act_name_, grad_fc_name_, grad_act_name_;
  SlotActivations<Acts> acts_;
  int64_t scratch_ = 0;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Mlp>(desc, b); }

}  // namespace

const LayerType kMlpLayer = {LayerKind::kMlp, "mlp", declare, build};

}  // namespace lockstep
