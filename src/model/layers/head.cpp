// The language-model head and the loss:
//   logits = lnf/out · headᵀ                                         (B, T, V)
//   losses = cross-entropy of the logits with the targets            (B, T)
// The head's weight is the embedding's wte when tied, else its own lm_head/weight (V, C); tensor
// parallelism splits the vocabulary (column-parallel head, vocabulary-parallel cross-entropy: no
// rank forms a whole row of logits). The loss is computed with its gradient in the backward (as
// llm.c fuses them: dlogits overwrite the logits), or alone in the forward of an evaluation.
#include <algorithm>
#include <vector>

#include "src/core/check.hpp"
#include "src/model/layers/registry.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

void declare(LayerDesc& d) {
  const std::string& pre = d.prefix;
  const std::string logits = pre + "logits", losses = pre + "losses";
  d.output = logits;
  if (!d.tied) {
    d.params.push_back({.name = pre + "lm_head/weight", .shape = {d.dims.V, d.dims.C}, .klass = ParamClass::kMatrix, .matmul = true, .split_dim = 0,
                        .segments = {d.dims.V}});
  }
  d.hooks.push_back({.name = logits, .region = HookRegion::kSplit, .split_dim = 2, .segments = {d.dims.V},
                     .op_site = true});
  d.hooks.push_back({.name = losses, .region = HookRegion::kWhole});
  d.ops = {
      {logits, "linear (head)", {d.input}, "head (wte when tied)"},
      {losses, "cross-entropy", {logits}, "targets"},
      {"loss", "mean of the per-token losses over the batch", {losses}, ""},
      {"grad/" + logits, "cross-entropy backward", {logits}, "targets"},
      {"grad/" + d.input, "linear backward (head, input gradient)", {"grad/" + logits}, "head"},
  };
}

// Adds a micro-batch's per-token losses to the running loss sum in canonical chunks of tokens.
void add_losses(ChunkCombiner& loss_sum, const float* losses, int64_t n) {
  for (int64_t i = 0; i < n; i += kCanonicalChunk) loss_sum.add(chunk_sum(losses + i, 1, std::min(kCanonicalChunk, n - i)));
}

class Head final : public Layer {
 public:
  Head(const LayerDesc& desc, const LayerBuild& b)
      : Layer(desc),
        C_(desc.dims.C),
        V_(b.local.V),
        w_(b.ctx.find_param(desc.tied ? "wte" : name("lm_head/weight"))),
        linear_(b.ctx.linear(this->desc(), *w_, kHeadLinear)),
        loss_(b.ctx.plan().loss(this->desc())),
        logits_name_(desc.output),
        losses_name_(name("losses")),
        grad_logits_name_("grad/" + logits_name_),
        grad_in_name_("grad/" + desc.input) {
    LS_REQUIRE(w_ != nullptr, desc.tied ? "a tied head needs the embedding's wte in the same model"
                                         : "the head has no weight");
    acts_.resize(static_cast<size_t>(b.slots));
    for (auto& a : acts_) {
      a.logits.resize(b.max_tokens * V_);
      a.losses.resize(b.max_tokens);
    }
  }

  const float* output(int slot) const override { return acts_[static_cast<size_t>(slot)].logits.data(); }

  void forward(LayerContext& ctx, const Pass& p, const float* x) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    linear_->forward(ctx.backend(), ctx.mode_of(logits_name_), {p.BT, C_, V_}, a.logits.data(), x,
                     ctx.linear_weight(w_, kHeadLinear), nullptr);
    ctx.observe(logits_name_, a.logits.data(), {p.B, p.T, V_});
    if (!p.eval) return;
    loss_->forward(ctx.backend(), ctx.mode(), p.BT, a.losses.data(), a.logits.data(), p.targets, 0.0f, false);
    ctx.observe(losses_name_, a.losses.data(), {p.B, p.T});
    add_losses(*p.loss_sum, a.losses.data(), p.BT);
  }

  // dinp = d(lnf/out): the stream's tokens (the head's input is gathered; its gradient is not).
  void backward(LayerContext& ctx, const Pass& p, const float* x, float*, float* dinp) override {
    Acts& a = acts_[static_cast<size_t>(p.slot)];
    loss_->forward(ctx.backend(), ctx.mode(), p.BT, a.losses.data(), a.logits.data(), p.targets, p.dloss, true);
    ctx.observe(losses_name_, a.losses.data(), {p.B, p.T});
    ctx.observe(grad_logits_name_, a.logits.data(), {p.B, p.T, V_});
    add_losses(*p.loss_sum, a.losses.data(), p.BT);
    const bool now = !ctx.defers_weight_grads();
    linear_->backward(ctx.backend(), ctx.mode(), {p.BT, C_, V_}, p.token_offset, dinp, now ? ctx.sink(w_) : GradSink{},
                      {}, a.logits.data(), x, ctx.linear_weight(w_, kHeadLinear));
    if (now) weight_ready(ctx, p);
    ctx.observe(grad_in_name_, dinp, {p.RB, p.RT, C_});
  }

  // The weight's gradient from the slot's dlogits (over its logits) and input.
  void backward_weight(LayerContext& ctx, const Pass& p, const float* x) override {
    linear_->backward(ctx.backend(), ctx.mode(), {p.BT, C_, V_}, p.token_offset, nullptr, ctx.sink(w_), {},
                      acts_[static_cast<size_t>(p.slot)].logits.data(), x, ctx.linear_weight(w_, kHeadLinear));
    weight_ready(ctx, p);
  }

 private:
  struct Acts {
    std::vector<float> logits, losses;
  };
  // A tied weight is the embedding's too: its gradient is final after the embedding's backward.
  void weight_ready(LayerContext& ctx, const Pass& p) const {
    if (!desc().tied) ctx.grads_ready(p, w_);
  }
  int64_t C_, V_;
  const ParamTensor* w_;
  std::unique_ptr<LinearOp> linear_;
  std::unique_ptr<LossOp> loss_;
  std::string logits_name_, losses_name_, grad_logits_name_, grad_in_name_;
  std::vector<Acts> acts_;
};

std::unique_ptr<Layer> build(const LayerDesc& desc, const LayerBuild& b) { return std::make_unique<Head>(desc, b); }

}  // namespace

const LayerType kHeadLayer = {LayerKind::kHead, "head", declare, build};

}  // namespace lockstep
