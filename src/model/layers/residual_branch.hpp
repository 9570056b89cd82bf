// The frames the sub-layers of a pre-norm block share: y = x + f(norm(x)).
//   PreNormBranch   the norm, its parameters and slot activations (the norm's output and
//                   statistics — shared with the other recomputed branches when recomputed), the
//                   stream after the branch (always its own), and the norm's forward and backward;
//   ResidualBranch  adds the linear into the branch (column-parallel under tensor parallelism)
//                   and the one back into the stream (row-parallel): y = x + out(f(in(norm(x)))),
//                   with the first and last steps of the forward and the backward, and — where
//                   the context defers weight gradients — the two linears' weight gradients in
//                   backward_weight, from copies of their output gradients (the stream's gradient
//                   and the branch's change before then; their inputs are the slot's).
// attention.cpp and mlp.cpp fill in f of a ResidualBranch, moe.cpp the whole branch of a
// PreNormBranch.
// Not here: the declarations (each kind declares its own names), f itself.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "src/model/layer.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

class PreNormBranch : public Layer {
 public:
  bool residual() const override { return true; }
  const float* output(int slot) const override { return res_[static_cast<size_t>(slot)].data(); }

 protected:
  // norm: the local name of the norm ("ln1").
  PreNormBranch(const LayerDesc& desc, const LayerBuild& b, const char* norm)
      : Layer(desc),
        C_(desc.dims.C),
        norm_(b.ctx.plan().norm(this->desc())),
        ln_w_(b.ctx.find_param(name(std::string(norm) + "/weight"))),
        ln_b_(b.ctx.find_param(name(std::string(norm) + "/bias"))),
        ln_name_(name(std::string(norm) + "/out")),
        grad_ln_name_("grad/" + ln_name_),
        grad_in_name_("grad/" + desc.input),
        norms_(b.ctx, desc.kind, "residual branch norm", b.slots, [&](Norm& n) {
          grow_to(n.ln, b.max_batch * desc.dims.T * desc.dims.C);
          grow_to(n.mean, b.max_stream);
          grow_to(n.rstd, b.max_stream);
        }) {
    res_.resize(static_cast<size_t>(b.slots));
    for (auto& r : res_) r.resize(static_cast<size_t>(b.max_stream * C_));
  }

  struct Norm {
    std::vector<float> ln, mean, rstd;  // norm(x) (all tokens) and its statistics
  };
  Norm& slot(const Pass& p) { return norms_[p.slot]; }
  float* res(const Pass& p) { return res_[static_cast<size_t>(p.slot)].data(); }

  // ln = norm(x), shown as ln1/out or ln2/out; stored for linear `reader` (rounded to bf16 as the
  // norm stores it where that linear runs in bf16 or fp8; "" : kept as computed).
  void norm_forward(LayerContext& ctx, const Pass& p, const float* x, const std::string& reader) {
    Norm& s = slot(p);
    norm_->forward(ctx.backend(), ctx.mode_of(ln_name_), p.BT, s.ln.data(), s.mean.data(), s.rstd.data(), x,
                   ctx.param(ln_w_), ctx.param(ln_b_), !reader.empty() && ctx.low_precision(reader));
    ctx.observe(ln_name_, s.ln.data(), {p.B, p.T, C_});
  }
  // From dnorm (the gradient of the norm's output, the stream's tokens): the norm's backward added
  // into dres, its parameter gradients, and dres shown as the gradient of the layer's input.
  void norm_backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float* dnorm) {
    Norm& s = slot(p);
    ctx.observe(grad_ln_name_, dnorm, {p.RB, p.RT, C_});
    norm_backward_rows(ctx.backend(), desc(), ctx.mode(), p.RS, p.stream_offset, dres, ctx.sink(ln_w_),
                       ctx.sink(ln_b_), dnorm, x, ctx.param(ln_w_), s.mean.data(), s.rstd.data());
    ctx.grads_ready(p, ln_w_, ln_b_);
    ctx.observe(grad_in_name_, dres, {p.RB, p.RT, C_});
  }

  int64_t C_;
  std::unique_ptr<NormOp> norm_;
  const ParamTensor *ln_w_, *ln_b_;
  std::string ln_name_, grad_ln_name_, grad_in_name_;
  SlotActivations<Norm> norms_;
  std::vector<std::vector<float>> res_;  // per slot: y, the stream (the next layer's input)
};

class ResidualBranch : public PreNormBranch {
 public:
  // The two linears' weight gradients from the slot's kept output gradients, out's first (backward
  // order).
  void backward_weight(LayerContext& ctx, const Pass& p, const float*) override {
    const Deferred& d = deferred_[static_cast<size_t>(p.slot)];
    out_->backward(ctx.backend(), ctx.mode(), {p.BT, d.branch_features, C_}, p.token_offset, nullptr, ctx.sink(out_w_),
                   ctx.sink(out_b_), d.dout.data(), d.branch, ctx.linear_weight(out_w_, out_linear_));
    ctx.grads_ready(p, out_w_, out_b_);
    in_->backward(ctx.backend(), ctx.mode(), {p.BT, C_, d.in_features}, p.token_offset, nullptr, ctx.sink(in_w_),
                  ctx.sink(in_b_), d.din.data(), slot(p).ln.data(), ctx.linear_weight(in_w_, in_linear_));
    ctx.grads_ready(p, in_w_, in_b_);
  }

 protected:
  // norm, in and out: the local names of the norm ("ln1") and of the two linears ("attn/qkv");
  // in_features: in's outputs here.
  ResidualBranch(const LayerDesc& desc, const LayerBuild& b, const char* norm, const char* in, const char* out,
                 int64_t in_features)
      : PreNormBranch(desc, b, norm),
        in_w_(b.ctx.find_param(name(std::string(in) + "/weight"))),
        in_b_(b.ctx.find_param(name(std::string(in) + "/bias"))),
        out_w_(b.ctx.find_param(name(std::string(out) + "/weight"))),
        out_b_(b.ctx.find_param(name(std::string(out) + "/bias"))),
        in_linear_(name(in)),
        out_linear_(name(out)),
        in_(b.ctx.linear(this->desc(), *in_w_, in_linear_)),
        out_(b.ctx.linear(this->desc(), *out_w_, out_linear_)) {
    if (!b.ctx.defers_weight_grads()) return;
    deferred_.resize(static_cast<size_t>(b.slots));
    for (Deferred& d : deferred_) {
      d.dout.resize(static_cast<size_t>(b.max_stream * C_));
      d.din.resize(static_cast<size_t>(b.max_tokens * in_features));
    }
  }

  void norm_forward(LayerContext& ctx, const Pass& p, const float* x) { PreNormBranch::norm_forward(ctx, p, x, in_linear_); }
  // res = x + out(branch) (branch: K features of every token), shown under the layer's output name.
  void out_forward(LayerContext& ctx, const Pass& p, const float* x, const float* branch, int64_t K) {
    float* y = res(p);
    out_->forward(ctx.backend(), ctx.mode_of(desc().output), {p.BT, K, C_}, y, branch,
                  ctx.linear_weight(out_w_, out_linear_), ctx.param(out_b_));
    ctx.backend().residual_forward(p.RS * C_, y, y, x);
    ctx.observe(desc().output, y, {p.RB, p.RT, C_});
  }
  // dbranch = out's input gradient from dres (the stream's); out's parameter gradients (or what
  // backward_weight needs for them).
  void out_backward(LayerContext& ctx, const Pass& p, const float* dres, float* dbranch, const float* branch,
                    int64_t K) {
    if (ctx.defers_weight_grads()) {
      Deferred& d = deferred_[static_cast<size_t>(p.slot)];
      std::copy_n(dres, p.RS * C_, d.dout.data());
      d.branch = branch;
      d.branch_features = K;
      out_->backward(ctx.backend(), ctx.mode(), {p.BT, K, C_}, p.token_offset, dbranch, {}, {}, dres, branch,
                     ctx.linear_weight(out_w_, out_linear_));
      return;
    }
    out_->backward(ctx.backend(), ctx.mode(), {p.BT, K, C_}, p.token_offset, dbranch, ctx.sink(out_w_),
                   ctx.sink(out_b_), dres, branch, ctx.linear_weight(out_w_, out_linear_));
    ctx.grads_ready(p, out_w_, out_b_);
  }
  // The backward's last steps from din (the gradient of in's K outputs): in's input gradient
  // (dnorm: the stream's tokens), then the norm's backward (PreNormBranch::norm_backward).
  void in_norm_backward(LayerContext& ctx, const Pass& p, const float* x, float* dres, float* dnorm, const float* din,
                        int64_t K) {
    if (ctx.defers_weight_grads()) {
      Deferred& d = deferred_[static_cast<size_t>(p.slot)];
      std::copy_n(din, p.BT * K, d.din.data());
      d.in_features = K;
      in_->backward(ctx.backend(), ctx.mode(), {p.BT, C_, K}, p.token_offset, dnorm, {}, {}, din, slot(p).ln.data(),
                    ctx.linear_weight(in_w_, in_linear_));
    } else {
      in_->backward(ctx.backend(), ctx.mode(), {p.BT, C_, K}, p.token_offset, dnorm, ctx.sink(in_w_), ctx.sink(in_b_),
                    din, slot(p).ln.data(), ctx.linear_weight(in_w_, in_linear_));
      ctx.grads_ready(p, in_w_, in_b_);
    }
    norm_backward(ctx, p, x, dres, dnorm);
  }

  const ParamTensor *in_w_, *in_b_, *out_w_, *out_b_;
  std::string in_linear_, out_linear_;  // the linears' names (precision.hpp)
  std::unique_ptr<LinearOp> in_, out_;

 private:
  // A slot's operands of the deferred weight gradients.
  struct Deferred {
    std::vector<float> dout, din;  // out's output gradient (the stream's rows), in's (all tokens)
    const float* branch = nullptr;  // out's input, in the slot's activations
    int64_t branch_features = 0, in_features = 0;
  };
  std::vector<Deferred> deferred_;  // per slot, where the context defers weight gradients
};

}  // namespace lockstep
