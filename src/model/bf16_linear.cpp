// A linear layer in bf16 (src/model/precision.hpp): the plan's own op, on bf16 operands, its
// outputs stored in bf16. The activation it reads comes stored in bf16 from the op that produced
// it; what this adds is the request that the plan's op read its output gradient rounded to bf16
// (LinearShape::round_dout: the residual stream's gradient stays fp32, and fast mode's products
// round it as they pack it, without a copy), read the fp32 master weight rounded to bf16 where the
// model passes it instead of its bf16 copy (LinearShape::round_weight; LayerContext decides), and
// round the product and the input gradient it writes (LinearShape::round_outputs): a plan rounds
// after its combination across ranks, so a layout rounds the very fp32 values one process would.
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

class Bf16Linear final : public LinearOp {
 public:
  Bf16Linear(std::unique_ptr<LinearOp> inner, const bool* weight_read_rounded)
      : inner_(std::move(inner)), weight_read_rounded_(weight_read_rounded) {}

  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w,
               const float* b) override {
    s.operands = Operands::kBf16;
    s.round_outputs = true;
    s.round_weight = weight_read_rounded();
    inner_->forward(be, mode, s, out, inp, w, b);
  }

  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    s.operands = Operands::kBf16;
    s.round_outputs = true;
    s.round_dout = true;
    s.round_weight = weight_read_rounded();
    inner_->backward(be, mode, s, token_offset, dinp, dw, db, dout, inp, w);
  }

 private:
  bool weight_read_rounded() const { return weight_read_rounded_ != nullptr && *weight_read_rounded_; }

  std::unique_ptr<LinearOp> inner_;
  const bool* weight_read_rounded_;
};

}  // namespace

std::unique_ptr<LinearOp> bf16_linear(std::unique_ptr<LinearOp> inner, const bool* weight_read_rounded) {
  return std::make_unique<Bf16Linear>(std::move(inner), weight_read_rounded);
}

}  // namespace lockstep
