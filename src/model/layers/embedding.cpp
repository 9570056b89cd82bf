// Token (and learned position) embedding: the residual stream from the tokens.
//   embed/out = wte[tokens] (+ wpe[t])                              (B, T, C): the stream
// Declares wte (V, C; split over the vocabulary by tensor parallelism, and the head's weight when
// tied) and, with learned positions, wpe (T, C).
#include <vector>

#include "src/model/layers/registry.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const LayerDims& m = d.dims;
  d.output = d.prefix + "embed/out";
  d.params.push_back({.name = d.prefix + "wte", .shape = {m.V, m.C}, .klass = ParamClass::kEmbedding, .matmul = d.tied, .split_dim = 0, .segments = {m.V}});
  if (d.pos == PosKind::kLearned) d.params.push_back({.name = d.prefix + "wpe", .shape = {m.T, m.C}, .klass = ParamClass::kEmbedding});
  d.hooks.push_back({.name = d.output, .region = HookRegion::kStream, .op_site = true});
  d.ops.push_back({d.output, "embedding", {}, "wte, wpe; tokens of the step's batch (data; equal when the sampler state is)"});
}

class Embedding final : public Layer {
 public:
  Embedding(const LayerDesc& desc, const LayerBuild& b)
      : Layer(desc), C_(desc.dims.C), seq_(b.ctx.plan().sequence(desc.dims.T)), op_(b.ctx.plan().embedding(this->desc())),
        wte_(b.ctx.find_param("wte")), wpe_(b.ctx.find_param("wpe")), out_name_(desc.output) {
    out_.resize(static_cast<size_t>(b.slots));
    for (auto& o : out_) o.resize(static_cast<size_t>(b.max_stream * C_));
  }

  void forward(LayerContext& ctx, const Pass& p, const float*) override {
    float* out = out_[static_cast<size_t>(p.slot)].data();
    op_->forward(ctx.backend(), ctx.mode_of(out_name_), p.B, seq_, out, p.inputs, ctx.param(wte_), ctx.param(wpe_));
    ctx.observe(out_name_, out, {p.RB, p.RT, C_});
  }
  const float* output(int slot) const override { return out_[static_cast<size_t>(slot)].data(); }

  void backward(LayerContext& ctx, const Pass& p, const float*, float* dout, float*) override {
    op_->backward(ctx.backend(), ctx.mode(), p.B, seq_, p.token_offset, ctx.sink(wte_), ctx.sink(wpe_), dout, p.inputs);
    if (p.last_micro) ctx.add_tied_partial(wte_);  // a tied head on another pipeline stage
    ctx.grads_ready(p, wte_, wpe_);
  }

 private:
  int64_t C_;
  std::vector<SeqBlock> seq_;  // the positions held here
  std::unique_ptr<EmbeddingOp> op_;
  const ParamTensor *wte_, *wpe_;
  std::string out_name_;
  std::vector<std::vector<float>> out_;  // per slot: (stream tokens, C)
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Embedding>(desc, b); }

}  // namespace

const LayerType kEmbeddingLayer = {LayerKind::kEmbedding, "embedding", declare, build};

}  // namespace lockstep
