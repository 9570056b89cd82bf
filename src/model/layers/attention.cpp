// The attention sub-layer of a pre-norm block: x1 = x0 + proj(attn(rope(qkv(norm1(x0))))).
//   ln1/out   norm of the stream                                    (B, T, C)
//   attn/qkv  [q | k | v] of every token, after RoPE                (B, T, (NH + 2·NKV)·HS)
//   attn/att  causal softmax of the scores                          (B, NH, T, T)
//   attn/out  attention-weighted values                             (B, T, NH·HS)
//   attn/res  the stream plus the projection                        (B, T, C)
// Tensor parallelism splits the heads: qkv is column-parallel (each rank its heads' q, k and v
// rows), proj row-parallel (their input columns).
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  const int64_t Q = m.NH * m.HS, KV = m.NKV * m.HS;
  const std::string& pre = d.prefix;
  d.output = pre + "attn/res";
  d.activation_flops = 12.0 * static_cast<double>(m.C) * static_cast<double>(m.T);  // Q·Kᵀ and att·V, 3 passes
  d.params.push_back({.name = pre + "ln1/weight", .shape = {m.C}, .norm = true, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "ln1/bias", .shape = {m.C}, .norm = true, .init = ParamInit::kZeros});
  }
  d.params.push_back({.name = pre + "attn/qkv/weight", .shape = {m.qkv_width(), m.C}, .decay = true, .matmul = true, .split_dim = 0,
                      .segments = {Q, KV, KV}});
  if (d.bias) {
    d.params.push_back({.name = pre + "attn/qkv/bias", .shape = {m.qkv_width()}, .init = ParamInit::kZeros,
                        .split_dim = 0, .segments = {Q, KV, KV}});
  }
  d.params.push_back({.name = pre + "attn/proj/weight", .shape = {m.C, Q}, .decay = true, .matmul = true,
                      .init_scale = d.residual_scale, .split_dim = 1, .segments = {Q}});
  if (d.bias) d.params.push_back({.name = pre + "attn/proj/bias", .shape = {m.C}, .init = ParamInit::kZeros});

  const std::string ln = pre + "ln1/out", qkv = pre + "attn/qkv", att = pre + "attn/att", out = pre + "attn/out";
  d.hooks.push_back({.name = ln, .region = HookRegion::kNormOut, .op_site = true});
  d.hooks.push_back({.name = qkv, .region = HookRegion::kSplit, .split_dim = 2, .segments = {Q, KV, KV}, .op_site = true});
  d.hooks.push_back({.name = att, .region = HookRegion::kSplit, .split_dim = 1, .segments = {m.NH}, .op_site = true});
  d.hooks.push_back({.name = out, .region = HookRegion::kSplit, .split_dim = 2, .segments = {Q}});
  d.hooks.push_back({.name = d.output, .region = HookRegion::kStream, .op_site = true});

  const std::string g = "grad/";
  d.ops = {
      {ln, "norm (ln1)", {d.input}, "ln1 weights"},
      {qkv, "linear (qkv) + RoPE", {ln}, "qkv weight and bias"},
      {att, "attention (scores, softmax)", {qkv}, ""},
      {out, "attention (weighted values)", {qkv}, ""},
      {d.output, "linear (attn proj) + residual", {out, d.input}, "proj weight and bias"},
      {g + out, "linear backward (attn proj, input gradient)", {g + d.output}, "proj weight"},
      {g + qkv, "attention backward", {g + out, qkv, att}, ""},
      {g + ln, "RoPE backward + linear backward (qkv, input gradient)", {g + qkv}, "qkv weight"},
      {g + d.input, "norm backward (" + pre + "ln1) + residual", {g + ln, d.input, g + d.output}, pre + "ln1 weights"},
  };
}

class Attention final : public Layer {
 public:
  Attention(const LayerDesc& desc, const LayerBuild& b)
      : Layer(desc),
        m_(b.local),
        norm_(b.ctx.plan().norm(this->desc())),
        ln_w_(b.ctx.find_param(name("ln1/weight"))),
        ln_b_(b.ctx.find_param(name("ln1/bias"))),
        qkv_w_(b.ctx.find_param(name("attn/qkv/weight"))),
        qkv_b_(b.ctx.find_param(name("attn/qkv/bias"))),
        proj_w_(b.ctx.find_param(name("attn/proj/weight"))),
        proj_b_(b.ctx.find_param(name("attn/proj/bias"))),
        qkv_(b.ctx.plan().linear(this->desc(), *qkv_w_)),
        proj_(b.ctx.plan().linear(this->desc(), *proj_w_)),
        ln_name_(name("ln1/out")),
        qkv_name_(name("attn/qkv")),
        att_name_(name("attn/att")),
        out_name_(name("attn/out")),
        res_name_(desc.output),
        grad_ln_name_("grad/" + ln_name_),
        grad_qkv_name_("grad/" + qkv_name_),
        grad_out_name_("grad/" + out_name_),
        grad_in_name_("grad/" + desc.input) {
    const int64_t BT = b.max_batch * m_.T, RS = b.max_stream, C = m_.C;
    acts_.resize(static_cast<size_t>(b.slots));
    for (auto& a : acts_) {
      a.ln.resize(BT * C);
      a.mean.resize(RS);
      a.rstd.resize(RS);
      a.qkv.resize(BT * m_.qkv_width());
      a.att.resize(b.max_batch * m_.NH * m_.T * m_.T);
      a.out.resize(BT * m_.NH * m_.HS);
      a.res.resize(RS * C);
    }
    scratch_ = RS * C + BT * m_.qkv_width() + BT * m_.NH * m_.HS + b.max_batch * m_.NH * m_.T * m_.T;
    if (desc.pos == PosKind::kRope) {
      const int64_t half = m_.HS / 2;
      rope_cos_.resize(m_.T * half);
      rope_sin_.resize(m_.T * half);
      b.ctx.backend().rope_tables(m_.T, m_.HS, desc.rope_theta, rope_cos_.data(), rope_sin_.data());
    }
  }

  bool residual() const override { return true; }
  int64_t scratch_floats() const override { return scratch_; }
  const float* output(int slot) const override { return acts_[static_cast<size_t>(slot)].res.data(); }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    const int64_t C = m_.C, BT = p.BT, A = m_.NH * m_.HS;
    const AttentionShape as = shape(p);
    norm_->forward(ctx.backend(), ctx.mode_of(ln_name_), BT, a.ln.data(), a.mean.data(), a.rstd.data(), x, ctx.param(ln_w_),
                   ctx.param(ln_b_));
    ctx.observe(ln_name_, a.ln.data(), {p.B, p.T, C});
    qkv_->forward(ctx.backend(), ctx.mode_of(qkv_name_), {BT, C, m_.qkv_width()}, a.qkv.data(), a.ln.data(), ctx.param(qkv_w_),
                  ctx.param(qkv_b_));
    if (!rope_cos_.empty()) ctx.backend().rope_forward(as, a.qkv.data(), rope_cos_.data(), rope_sin_.data());
    ctx.observe(qkv_name_, a.qkv.data(), {p.B, p.T, m_.qkv_width()});
    ctx.backend().attention_forward(ctx.mode_of(att_name_), as, a.out.data(), a.att.data(), a.qkv.data());
    ctx.observe(att_name_, a.att.data(), {p.B, m_.NH, p.T, p.T});
    ctx.observe(out_name_, a.out.data(), {p.B, p.T, A});
    proj_->forward(ctx.backend(), ctx.mode_of(res_name_), {BT, A, C}, a.res.data(), a.out.data(), ctx.param(proj_w_),
                   ctx.param(proj_b_));
    ctx.backend().residual_forward(p.RS * C, a.res.data(), a.res.data(), x);
    ctx.observe(res_name_, a.res.data(), {p.RB, p.RT, C});
  }

  // dres: d(x1) in, d(x0) out (the stream gradient, in place).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float*) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    const Mode mode = ctx.mode();
    const int64_t C = m_.C, BT = p.BT, A = m_.NH * m_.HS;
    const AttentionShape as = shape(p);
    float* dnorm = ctx.scratch();              // (stream tokens, C)
    float* dqkv = dnorm + p.RS * C;            // (BT, qkv)
    float* dout = dqkv + BT * m_.qkv_width();  // (BT, A)
    float* datt = dout + BT * A;               // (B, NH, T, T)
    proj_->backward(ctx.backend(), mode, {BT, A, C}, p.token_offset, dout, ctx.sink(proj_w_), ctx.sink(proj_b_), dres,
                    a.out.data(), ctx.param(proj_w_));
    ctx.grads_ready(p, proj_w_, proj_b_);
    ctx.observe(grad_out_name_, dout, {p.B, p.T, A});
    ctx.backend().attention_backward(mode, as, dqkv, datt, dout, a.qkv.data(), a.att.data());
    ctx.observe(grad_qkv_name_, dqkv, {p.B, p.T, m_.qkv_width()});
    if (!rope_cos_.empty()) ctx.backend().rope_backward(as, dqkv, rope_cos_.data(), rope_sin_.data());
    qkv_->backward(ctx.backend(), mode, {BT, C, m_.qkv_width()}, p.token_offset, dnorm, ctx.sink(qkv_w_), ctx.sink(qkv_b_), dqkv,
                   a.ln.data(), ctx.param(qkv_w_));
    ctx.grads_ready(p, qkv_w_, qkv_b_);
    ctx.observe(grad_ln_name_, dnorm, {p.RB, p.RT, C});
    norm_backward_rows(ctx.backend(), desc(), mode, p.RS, p.stream_offset, dres, ctx.sink(ln_w_), ctx.sink(ln_b_), dnorm, x,
                       ctx.param(ln_w_), a.mean.data(), a.rstd.data());
    ctx.grads_ready(p, ln_w_, ln_b_);
    ctx.observe(grad_in_name_, dres, {p.RB, p.RT, C});
  }

 private:
  struct Acts {
    std::vector<float> ln, mean, rstd, qkv, att, out, res;
  };
  AttentionShape shape(const Pass& p) const { return {p.B, p.T, m_.NH, m_.NKV, m_.HS}; }

  LayerDims m_;
  std::unique_ptr<NormOp> norm_;
  const ParamTensor *ln_w_, *ln_b_, *qkv_w_, *qkv_b_, *proj_w_, *proj_b_;
  std::unique_ptr<LinearOp> qkv_, proj_;
  std::string ln_name_, qkv_name_, att_name_, out_name_, res_name_;
  std::string grad_ln_name_, grad_qkv_name_, grad_out_name_, grad_in_name_;
  std::vector<Acts> acts_;
  std::vector<float> rope_cos_, rope_sin_;
  int64_t scratch_ = 0;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Attention>(desc, b); }

}  // namespace

const LayerType kAttentionLayer = {LayerKind::kAttention, "attention", declare, build};

}  // namespace lockstep
