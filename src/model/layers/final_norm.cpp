// The final norm: lnf/out = norm(x) over the last block's stream     (B, T, C)
// (gathered over the tokens under sequence parallelism, for the head).
#include <algorithm>
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const std::string& pre = d.prefix;
  d.output = pre + "lnf/out";
  d.params.push_back({.name = pre + "lnf/weight", .shape = {d.dims.C}, .klass = ParamClass::kNorm, .init = ParamInit::kOnes});
  if (d.norm == NormKind::kLayerNorm) {
    d.params.push_back({.name = pre + "lnf/bias", .shape = {d.dims.C}, .klass = ParamClass::kNorm, .init = ParamInit::kZeros});
  }
  d.hooks.push_back({.name = d.output, .region = HookRegion::kNormOut, .op_site = true});
  d.ops = {
      {d.output, "final norm", {d.input}, "lnf weights"},
      {"grad/" + d.input, "final norm backward", {"grad/" + d.output, d.input}, "lnf weights"},
  };
}

class FinalNorm final : public Layer {
 public:
  FinalNorm(const LayerDesc& desc, const LayerBuild& b)
      : Layer(desc),
        C_(desc.dims.C),
        norm_(b.ctx.plan().norm(this->desc())),
        w_(b.ctx.find_param(name("lnf/weight"))),
        b_(b.ctx.find_param(name("lnf/bias"))),
        out_name_(desc.output),
        grad_in_name_("grad/" + desc.input) {
    acts_.resize(static_cast<size_t>(b.slots));
    for (auto& a : acts_) {
      a.out.resize(b.max_tokens * C_);
      a.mean.resize(b.max_stream);
      a.rstd.resize(b.max_stream);
    }
  }

  const float* output(int slot) const override { return acts_[static_cast<size_t>(slot)].out.data(); }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    norm_->forward(ctx.backend(), ctx.mode_of(out_name_), p.BT, a.out.data(), a.mean.data(), a.rstd.data(), x, ctx.param(w_),
                   ctx.param(b_), ctx.low_precision(kHeadLinear));
    ctx.observe(out_name_, a.out.data(), {p.B, p.T, C_});
  }

  // dout: d(lnf/out), the stream's tokens; dinp = d(x), written (the norm's backward adds to it).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float* dout, float* dinp) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    std::fill_n(dinp, p.RS * C_, 0.0f);
    norm_backward_rows(ctx.backend(), desc(), ctx.mode(), p.RS, p.stream_offset, dinp, ctx.sink(w_), ctx.sink(b_), dout, x,
                       ctx.param(w_), a.mean.data(), a.rstd.data());
    ctx.grads_ready(p, w_, b_);
    ctx.observe(grad_in_name_, dinp, {p.RB, p.RT, C_});
  }

 private:
  struct Acts {
    std::vector<float> out, mean, rstd;
  };
  int64_t C_;
  std::unique_ptr<NormOp> norm_;
  const ParamTensor *w_, *b_;
  std::string out_name_, grad_in_name_;
  std::vector<Acts> acts_;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<FinalNorm>(desc, b); }

}  // namespace

const LayerType kFinalNormLayer = {LayerKind::kFinalNorm, "final norm", declare, build};

}  // namespace lockstep
