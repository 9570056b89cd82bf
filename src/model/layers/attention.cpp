// The attention sub-layer of a pre-norm block: x1 = x0 + proj(attn(rope(qkv(norm1(x0))))).
//   ln1/out   norm of the stream                                    (B, T, C)
//   attn/qkv  [q | k | v] of every token, after RoPE                (B, T, (NH + 2·NKV)·HS)
//   attn/att  causal softmax of the scores                          (B, NH, T, T)
//             (of the queries held here: context parallelism's blocks of positions, each against
//             every key; the plan's AttentionOp, which may keep less: the ring's row statistics)
//   attn/out  attention-weighted values                             (B, T, NH·HS)
//   attn/res  the stream plus the projection                        (B, T, C)
// Tensor parallelism splits the heads: qkv is column-parallel (each rank its heads' q, k and v
// rows), proj row-parallel (their input columns).
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/layers/residual_branch.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  const int64_t Q = m.NH * m.HS, KV = m.NKV * m.HS;
  const std::string& pre = d.prefix;
  d.output = pre + "attn/res";
  d.activation_flops = 12.0 * static_cast<double>(m.C) * static_cast<double>(m.T);  // Q·Kᵀ and att·V, 3 passes
  d.params.push_back({.name = pre + "ln1/weight", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "ln1/bias", .shape = {m.C}, .klass = ParamClass::kNorm, .init = ParamInit::kZeros});
  }
  d.params.push_back({.name = pre + "attn/qkv/weight", .shape = {m.qkv_width(), m.C}, .klass = ParamClass::kMatrix, .matmul = true, .split_dim = 0,
                      .segments = {Q, KV, KV}});
  if (d.bias) {
    d.params.push_back({.name = pre + "attn/qkv/bias", .shape = {m.qkv_width()}, .klass = ParamClass::kBias, .init = ParamInit::kZeros,
                        .split_dim = 0, .segments = {Q, KV, KV}});
  }
  d.params.push_back({.name = pre + "attn/proj/weight", .shape = {m.C, Q}, .klass = ParamClass::kMatrix, .matmul = true,
                      .init_scale = d.residual_scale, .split_dim = 1, .segments = {Q}});
  if (d.bias) d.params.push_back({.name = pre + "attn/proj/bias", .shape = {m.C}, .klass = ParamClass::kBias, .init = ParamInit::kZeros});

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

class Attention final : public ResidualBranch {
 public:
  Attention(const LayerDesc& desc, const LayerBuild& b)
      : ResidualBranch(desc, b, "ln1", "attn/qkv", "attn/proj", b.local.qkv_width()),
        m_(b.local),
        qkv_name_(name("attn/qkv")),
        att_name_(name("attn/att")),
        out_name_(name("attn/out")),
        grad_qkv_name_("grad/" + qkv_name_),
        grad_out_name_("grad/" + out_name_),
        seq_(b.ctx.plan().sequence(m_.T)),
        op_(b.ctx.plan().attention(desc)),
        acts_(b.ctx, LayerKind::kAttention, "attention", b.slots, [&](Acts& a) {
          grow_to(a.qkv, b.max_tokens * m_.qkv_width());
          grow_to(a.att, b.max_tokens * op_->kept_floats(m_));
          grow_to(a.out, b.max_tokens * m_.NH * m_.HS);
        }) {
    const int64_t BT = b.max_tokens;
    scratch_ = b.max_stream * m_.C + BT * m_.qkv_width() + BT * m_.NH * m_.HS + BT * op_->scratch_floats(m_);
    if (desc.pos == PosKind::kRope) {
      const int64_t half = m_.HS / 2;
      rope_cos_.resize(m_.T * half);
      rope_sin_.resize(m_.T * half);
      b.ctx.backend().rope_tables(m_.T, m_.HS, desc.rope_theta, rope_cos_.data(), rope_sin_.data());
    }
  }

  int64_t scratch_floats() const override { return scratch_; }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    const AttentionShape as = shape(p);
    norm_forward(ctx, p, x);
    in_->forward(be, ctx.mode_of(qkv_name_), {p.BT, m_.C, m_.qkv_width()}, a.qkv.data(), slot(p).ln.data(),
                 ctx.linear_weight(in_w_, in_linear_), ctx.param(in_b_));
    if (!rope_cos_.empty()) {
      rope(be, p, a.qkv.data(), false);
      ctx.store_for(in_linear_, a.qkv.data(), p.BT * m_.qkv_width());
    }
    ctx.observe(qkv_name_, a.qkv.data(), {p.B, p.T, m_.qkv_width()});
    op_->forward(be, ctx.mode_of(att_name_), as, a.out.data(), a.att.data(), a.qkv.data());
    if (op_->keeps_probabilities()) ctx.observe(att_name_, a.att.data(), {p.B, m_.NH, p.T, m_.T});
    ctx.store_for(out_linear_, a.out.data(), p.BT * m_.NH * m_.HS);
    ctx.observe(out_name_, a.out.data(), {p.B, p.T, m_.NH * m_.HS});
    out_forward(ctx, p, x, a.out.data(), m_.NH * m_.HS);
  }

  // dres: d(x1) in, d(x0) out (the stream gradient, in place).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float*) override {
    Acts& a = acts_[p.slot];
    Backend& be = ctx.backend();
    const int64_t A = m_.NH * m_.HS;
    const AttentionShape as = shape(p);
    float* dnorm = ctx.scratch();               // (stream tokens, C)
    float* dqkv = dnorm + p.RS * m_.C;          // (BT, qkv)
    float* dout = dqkv + p.BT * m_.qkv_width(); // (BT, A)
    float* datt = dout + p.BT * A;              // the op's workspace: (B, NH, tokens, T) by default
    out_backward(ctx, p, dres, dout, a.out.data(), A);
    ctx.observe(grad_out_name_, dout, {p.B, p.T, A});
    op_->backward(be, ctx.mode(), as, dqkv, datt, dout, a.qkv.data(), a.att.data());
    ctx.observe(grad_qkv_name_, dqkv, {p.B, p.T, m_.qkv_width()});
    if (!rope_cos_.empty()) rope(be, p, dqkv, true);
    in_norm_backward(ctx, p, x, dres, dnorm, dqkv, m_.qkv_width());
  }

 private:
  struct Acts {
    std::vector<float> qkv, att, out;
  };
  AttentionShape shape(const Pass& p) const { return {p.B, m_.T, m_.NH, m_.NKV, m_.HS}; }
  // RoPE (forward or backward) over the tokens here, each block of positions with its rows of the
  // tables.
  void rope(Backend& be, const Pass& p, float* x, bool backward) const {
    const int64_t half = m_.HS / 2;
    int64_t row = 0;
    for (const SeqBlock& k : seq_) {
      const AttentionShape s{p.B, k.length, m_.NH, m_.NKV, m_.HS};
      float* rows = x + row * m_.qkv_width();
      const float *c = rope_cos_.data() + k.position * half, *sn = rope_sin_.data() + k.position * half;
      if (backward) {
        be.rope_backward(s, rows, c, sn);
      } else {
        be.rope_forward(s, rows, c, sn);
      }
      row += p.B * k.length;
    }
  }

  LayerDims m_;
  std::string qkv_name_, att_name_, out_name_, grad_qkv_name_, grad_out_name_;
  std::vector<SeqBlock> seq_;  // the positions held here
  std::unique_ptr<AttentionOp> op_;
  SlotActivations<Acts> acts_;
  std::vector<float> rope_cos_, rope_sin_;
  int64_t scratch_ = 0;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Attention>(desc, b); }

}  // namespace

const LayerType kAttentionLayer = {LayerKind::kAttention, "attention", declare, build};

}  // namespace lockstep
