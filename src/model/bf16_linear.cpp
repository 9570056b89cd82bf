// A linear layer in bf16 (src/model/precision.hpp): the plan's own op, on bf16 operands, its
// outputs stored in bf16. The activation it reads comes stored in bf16 from the op that produced
// it and the weight is the model's bf16 copy (LayerContext); what this adds is the rounding of the
// output gradient it reads (a copy: the residual stream's gradient stays fp32), on the rows the
// plan's op reads — all tokens, but a row-parallel op reads the stream tokens' output gradient
// under sequence parallelism (modules.hpp) — and the request that the plan's op round the product
// and the input gradient it writes (LinearShape::round_outputs): a plan rounds after its
// combination across ranks, so a layout rounds the very fp32 values one process would.
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

class Bf16Linear final : public LinearOp {
 public:
  Bf16Linear(std::unique_ptr<LinearOp> inner, const ModelPlan& plan, bool stream_output, std::vector<float>& scratch)
      : inner_(std::move(inner)), plan_(plan), stream_output_(stream_output), scratch_(scratch) {}

  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w,
               const float* b) override {
    s.operands = Operands::kBf16;
    s.round_outputs = true;
    inner_->forward(be, mode, s, out, inp, w, b);
  }

  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    const int64_t dout_n = (stream_output_ ? plan_.stream_tokens(s.N) : s.N) * s.OC;
    if (scratch_.size() < static_cast<size_t>(dout_n)) scratch_.resize(static_cast<size_t>(dout_n));
    be.round_to_bf16(dout_n, scratch_.data(), dout);
    s.operands = Operands::kBf16;
    s.round_outputs = true;
    inner_->backward(be, mode, s, token_offset, dinp, dw, db, scratch_.data(), inp, w);
  }

 private:
  std::unique_ptr<LinearOp> inner_;
  const ModelPlan& plan_;
  bool stream_output_;
  std::vector<float>& scratch_;
};

}  // namespace

std::unique_ptr<LinearOp> bf16_linear(std::unique_ptr<LinearOp> inner, const ModelPlan& plan, bool stream_output,
                                      std::vector<float>& scratch) {
  return std::make_unique<Bf16Linear>(std::move(inner), plan, stream_output, scratch);
}

}  // namespace lockstep
