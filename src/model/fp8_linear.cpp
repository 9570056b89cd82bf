// A linear layer in fp8 (fp8_recipe.hpp): the bf16 linear's operands (bf16_linear.cpp: the
// activation stored in bf16, the weight's bf16 copy, the output gradient rounded to bf16 here),
// quantized by the recipe for each GEMM that runs in fp8 — fprop reads input and weight rowwise,
// dgrad the output gradient rowwise and the weight columnwise, wgrad the output gradient and the
// input columnwise (per-tensor recipes: one copy serves both directions) — and the plan's op run
// on the dequantized values with its outputs rounded to bf16. The bias gradient comes from the
// bf16 output gradient; the fp8 GEMMs accumulate as the recipe says (fp32 or Hopper's limited
// accumulator). A weight is quantized once per step (its copies are the model's); each
// tensor's first quantization in a pass records its statistics (Fp8State::record: a weight's once
// a step), but not in evaluation or a recomputed forward. Every fp8 GEMM is shown to the tap, when
// one is set, with its operands (the fp8 sentinel's shadow checks).
#include <array>

#include "src/model/fp8_state.hpp"
#include "src/model/modules.hpp"

namespace lockstep {

namespace {

class Fp8Linear final : public LinearOp {
 public:
  Fp8Linear(std::unique_ptr<LinearOp> inner, const Fp8LinearSetup& setup, const std::string& name, bool stream_output,
            Fp8WeightCopies& weights)
      : inner_(std::move(inner)),
        setup_(setup),
        name_(name),
        weights_(weights),
        recipe_(setup.state.recipe()),
        stream_output_(stream_output),
        // Power-of-two scales keep every dequantized value a bf16 value (kernels may take them so).
        operands_(recipe_.scaling == Fp8Scaling::kMxfp8 || recipe_.power_of_two ? Operands::kBf16 : Operands::kFp32) {
    for (Fp8Role r : kFp8Roles) index_[static_cast<size_t>(r)] = setup.state.index(name, r);
  }

  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w,
               const float* b) override {
    s.round_outputs = true;
    if (!recipe_.fprop) {
      s.operands = Operands::kBf16;
      inner_->forward(be, mode, s, out, inp, w, b);
      return;
    }
    s.operands = operands_;
    s.accumulation = recipe_.accumulation;
    const float* x = quantize(be, Fp8Role::kInput, Fp8Direction::kRowwise, s.N, s.IC, inp, setup_.scratch.x, true);
    const QuantizeShape x_shape = last_;
    const Cached& wq = weight(be, Fp8Direction::kRowwise, s.OC, s.IC, w);
    tap(Fp8Gemm::kFprop, s.N, s.OC, s.IC, {inp, x, x_shape, false}, {w, wq.data, wq.shape, true});
    inner_->forward(be, mode, s, out, x, wq.data, b);
  }

  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    // A row-parallel op on the stream reads its stream tokens' output gradient under sequence
    // parallelism.
    const int64_t rows = stream_output_ ? setup_.plan.stream_tokens(s.N) : s.N;
    float* dy = grown(setup_.scratch.dy, rows * s.OC);
    be.round_to_bf16(rows * s.OC, dy, dout);
    LinearShape bf16 = s, fp8 = s;
    bf16.operands = Operands::kBf16;
    fp8.operands = operands_;
    fp8.accumulation = recipe_.accumulation;
    bf16.round_outputs = fp8.round_outputs = true;
    if (!db.empty()) inner_->backward(be, mode, bf16, token_offset, nullptr, {}, db, dy, inp, w);
    bool dy_recorded = false;
    if (dinp != nullptr) {
      if (recipe_.dgrad) {
        const float* dyq = quantize(be, Fp8Role::kGradOutput, Fp8Direction::kRowwise, rows, s.OC, dy, setup_.scratch.dy_row, true);
        dy_row_shape_ = last_;
        dy_recorded = true;
        const QuantizeShape dyq_shape = last_;
        const Cached& wq = weight(be, Fp8Direction::kColumnwise, s.OC, s.IC, w);
        tap(Fp8Gemm::kDgrad, rows, s.IC, s.OC, {dy, dyq, dyq_shape, false}, {w, wq.data, wq.shape, false});
        inner_->backward(be, mode, fp8, token_offset, dinp, {}, {}, dyq, inp, wq.data);
      } else {
        inner_->backward(be, mode, bf16, token_offset, dinp, {}, {}, dy, inp, w);
      }
    }
    if (!dw.empty()) {
      if (recipe_.wgrad) {
        const bool reuse = recipe_.per_tensor() && dy_recorded;
        const float* dyq =
            reuse ? setup_.scratch.dy_row.data()
                  : quantize(be, Fp8Role::kGradOutput, Fp8Direction::kColumnwise, rows, s.OC, dy, setup_.scratch.dy_col,
                             !dy_recorded);
        const QuantizeShape dyq_shape = reuse ? dy_row_shape_ : last_;
        const float* xq = quantize(be, Fp8Role::kInput, Fp8Direction::kColumnwise, s.N, s.IC, inp, setup_.scratch.x, false);
        // Under sequence parallelism a row-parallel op's wgrad reads the gathered gradient: its
        // tokens are not all here, and the check of its quantization is left to the dgrad's.
        if (rows == s.N) tap(Fp8Gemm::kWgrad, s.OC, s.IC, rows, {dy, dyq, dyq_shape, true}, {inp, xq, last_, false});
        inner_->backward(be, mode, fp8, token_offset, nullptr, dw, {}, dyq, xq, w);
      } else {
        inner_->backward(be, mode, bf16, token_offset, nullptr, dw, {}, dy, inp, w);
      }
    }
  }

 private:
  static float* grown(std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    return v.data();
  }

  // src (rows × cols) quantized for `role` into buf (grown as needed; a weight's copies are
  // allocated by the model); its statistics recorded if `record` and the model is recording.
  const float* quantize(Backend& be, Fp8Role role, Fp8Direction d, int64_t rows, int64_t cols, const float* src,
                        std::vector<float>& buf, bool record, Fp8Counts* counts_out = nullptr) {
    const size_t i = index_[static_cast<size_t>(role)];
    const Fp8Format format = recipe_.format(role);
    float scale = 1.0f;
    if (recipe_.scaling == Fp8Scaling::kDelayed) {
      scale = setup_.state.scale(i);
    } else if (recipe_.scaling == Fp8Scaling::kCurrent) {
      float amax = 0.0f;
      be.abs_max(rows * cols, &amax, src);
      setup_.plan.max_over_shards(&amax, 1);  // the whole tensor's, wherever its parts are
      scale = fp8_scale(amax, format, static_cast<int>(recipe_.margin), recipe_.power_of_two, 1.0f);
    }
    float* out = grown(buf, rows * cols);
    Fp8Counts counts;
    last_ = recipe_.shape(role, d, rows, cols, scale);
    be.quantize_fp8(last_, out, &counts, src);
    if (record && setup_.recording()) setup_.state.record(i, counts, rows * cols);
    if (counts_out != nullptr) *counts_out = counts;
    return out;
  }

  // A quantized copy of the weight, made once per step: neither the weight nor its scale changes
  // within one (Fp8State::generation moves on with the scales, before the update).
  struct Cached {
    uint64_t generation = UINT64_MAX;
    const float* data = nullptr;
    QuantizeShape shape;
    Fp8Counts counts;
    bool recorded = false;  // its statistics are in this step's
  };
  const Cached& weight(Backend& be, Fp8Direction d, int64_t OC, int64_t IC, const float* w) {
    // The rowwise copy serves both directions unless the recipe's blocks differ by direction.
    const bool columnwise = d == Fp8Direction::kColumnwise && !weights_.columnwise.empty();
    Cached& c = cached_[columnwise ? 1 : 0];
    const uint64_t generation = setup_.state.generation();
    if (c.generation != generation) {
      std::vector<float>& buf = columnwise ? weights_.columnwise : weights_.rowwise;
      c.data = quantize(be, Fp8Role::kWeight, columnwise ? Fp8Direction::kColumnwise : Fp8Direction::kRowwise, OC, IC, w,
                        buf, false, &c.counts);
      c.generation = generation;
      c.shape = last_;
      c.recorded = false;
    }
    // The rowwise copy's statistics, once a step, by the first pass that records.
    if (!columnwise && !c.recorded && setup_.recording()) {
      setup_.state.record(index_[static_cast<size_t>(Fp8Role::kWeight)], c.counts, OC * IC);
      c.recorded = true;
    }
    return c;
  }

  // The GEMM to the tap, if one is set and the pass records.
  void tap(Fp8Gemm gemm, int64_t M, int64_t N, int64_t K, Fp8GemmOperand a, Fp8GemmOperand b) const {
    if (setup_.tap == nullptr || !*setup_.tap || !setup_.recording()) return;
    (*setup_.tap)({name_, gemm, M, N, K, a, b});
  }

  std::unique_ptr<LinearOp> inner_;
  Fp8LinearSetup setup_;
  std::string name_;
  // The shape of the last quantization, and of the output gradient's rowwise one.
  QuantizeShape last_;
  QuantizeShape dy_row_shape_;
  Fp8WeightCopies& weights_;
  const Fp8Recipe& recipe_;
  bool stream_output_;
  Operands operands_;
  std::array<size_t, 3> index_{};
  Cached cached_[2];  // rowwise, columnwise
};

}  // namespace

const char* fp8_gemm_name(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::kFprop: return "fprop";
    case Fp8Gemm::kDgrad: return "dgrad";
    case Fp8Gemm::kWgrad: return "wgrad";
  }
  return "?";
}

std::unique_ptr<LinearOp> fp8_linear(std::unique_ptr<LinearOp> inner, const Fp8LinearSetup& setup,
                                     const std::string& name, bool stream_output, Fp8WeightCopies& weights) {
  return std::make_unique<Fp8Linear>(std::move(inner), setup, name, stream_output, weights);
}

}  // namespace lockstep
