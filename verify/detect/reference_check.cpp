#include "verify/detect/reference_check.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>

#include "reference/activation.hpp"
#include "reference/bounded.hpp"
#include "reference/cast.hpp"
#include "reference/linear.hpp"
#include "reference/norm.hpp"
#include "reference/quantize.hpp"
#include "src/core/check.hpp"
#include "verify/detect/agreed.hpp"

namespace lockstep::detect {

namespace {

using Real = reference::Bounded<double>;
using Kind = SampledOp::Kind;

// Multiply-adds of an op's rows a check re-computes (at least one row).
constexpr int64_t kBudget = int64_t{1} << 20;

std::vector<Real> to_real(std::span<const float> x) {
  std::vector<Real> r;
  r.reserve(x.size());
  for (float v : x) r.emplace_back(static_cast<double>(v));
  return r;
}

}  // namespace

std::vector<SampledOp> sampled_ops(const Model& model, int64_t tp, bool sp) {
  const auto has = [&](const std::string& name) {
    const auto& l = model.param_layout();
    return std::any_of(l.begin(), l.end(), [&](const ParamTensor& t) { return t.name == name; });
  };
  const auto opt = [&](const std::string& name) { return has(name) ? name : std::string(); };
  std::vector<SampledOp> ops;
  for (const LayerDesc& l : model.desc().layers) {
    const std::string& p = l.prefix;
    // reader: the linear that reads the norm's output.
    const auto norm = [&](const std::string& ln, const std::string& input, const std::string& reader) {
      if (sp) return;  // the norm's input is this rank's tokens, its output gathered over tp
      ops.push_back({.kind = Kind::kNorm, .output = p + ln + "/out", .inputs = {input}, .weight = p + ln + "/weight",
                     .bias = opt(p + ln + "/bias"), .norm = l.norm, .eps = l.norm_eps, .linear = reader});
    };
    const auto linear = [&](const std::string& out, const std::string& in, const std::string& w) {
      ops.push_back({.kind = Kind::kLinear, .output = out, .inputs = {in}, .weight = w + "/weight",
                     .bias = opt(w + "/bias"), .linear = w});
    };
    const auto projection = [&](const std::string& branch, const std::string& w) {
      if (tp > 1) return;  // row-parallel: the product is a sum over the tp group
      ops.push_back({.kind = Kind::kLinearResidual, .output = l.output, .inputs = {branch, l.input},
                     .weight = w + "/weight", .bias = opt(w + "/bias"), .linear = w});
    };
    switch (l.kind) {
      case LayerKind::kAttention:
        norm("ln1", l.input, p + "attn/qkv");
        if (l.pos != PosKind::kRope) linear(p + "attn/qkv", p + "ln1/out", p + "attn/qkv");
        projection(p + "attn/out", p + "attn/proj");
        break;
      case LayerKind::kMlp:
        norm("ln2", l.input, p + "mlp/fc");
        linear(p + "mlp/fc", p + "ln2/out", p + "mlp/fc");
        ops.push_back({.kind = Kind::kActivation, .output = p + "mlp/act", .inputs = {p + "mlp/fc"}, .ffn = l.ffn,
                       .linear = p + "mlp/proj"});
        projection(p + "mlp/act", p + "mlp/proj");
        break;
      case LayerKind::kFinalNorm: norm("lnf", l.input, kHeadLinear); break;
      case LayerKind::kHead:
        ops.push_back({.kind = Kind::kLinear, .output = l.output, .inputs = {l.input},
                       .weight = l.tied ? "wte" : p + "lm_head/weight", .linear = std::string(kHeadLinear)});
        break;
      case LayerKind::kEmbedding: break;
      case LayerKind::kMoe:  // the norm and the router, both fp32 whatever the recipe (the experts' rows are no hook)
        norm("ln2", l.input, "");
        ops.push_back({.kind = Kind::kLinear, .output = p + "moe/router", .inputs = {p + "ln2/out"},
                       .weight = p + "moe/router/weight"});
        break;
    }
  }
  // Current fp8 scaling takes a split weight's amax over the tp group, which this check does not see.
  const Fp8State* fp8 = model.fp8();
  const bool unseen_scales = fp8 != nullptr && fp8->recipe().scaling == Fp8Scaling::kCurrent && tp > 1;
  std::erase_if(ops, [&](const SampledOp& op) {
    const bool product = op.kind == Kind::kLinear || op.kind == Kind::kLinearResidual;
    if (unseen_scales && product && fp8->find(op.linear + "/input") != SIZE_MAX) return true;
    return !model.holds_site(op.output) ||
           std::any_of(op.inputs.begin(), op.inputs.end(), [&](const std::string& in) { return !model.holds_site(in); });
  });
  return ops;
}

void ReferenceCheck::begin_step(int64_t step) {
  op_ = nullptr;
  checked_ = false;
  inputs_.clear();
  ratio_ = 0;
  worst_ = -1;
  due_ = every_ > 0 && (step + 1) % every_ == 0;
  if (!due_ || ops_.empty()) return;
  op_ = &ops_[static_cast<size_t>((step / every_) % static_cast<int64_t>(ops_.size()))];
  rows_ = 0;  // set by the first input, from its shape
}

void ReferenceCheck::observe(std::string_view name, const TensorView& t) {
  if (op_ == nullptr || checked_) return;
  if (name == op_->output) {
    if (inputs_.size() == op_->inputs.size()) check(t);
    return;
  }
  if (std::find(op_->inputs.begin(), op_->inputs.end(), name) == op_->inputs.end() ||
      inputs_.contains(std::string(name))) {
    return;
  }
  LS_CHECK(t.is_contiguous() && t.shape.rank() >= 1, "reference check: ", name, " is not a contiguous tensor");
  const int64_t width = t.shape[t.shape.rank() - 1], total_rows = t.numel() / width;
  if (rows_ == 0) {
    const int64_t per_row = op_->weight.empty() || op_->kind == Kind::kNorm ? width : model_.param(op_->weight).numel;
    rows_ = std::clamp<int64_t>(kBudget / std::max<int64_t>(per_row, 1), 1, total_rows);
  }
  const float* x = t.f32();
  inputs_[std::string(name)].assign(x, x + rows_ * width);
  // Current fp8 scaling quantizes the input with the whole tensor's amax.
  if (name == op_->inputs[0] && recipe_.fp8_linear(op_->linear) && recipe_.fp8.scaling == Fp8Scaling::kCurrent) {
    input_amax_ = 0;
    for (int64_t i = 0; i < t.numel(); ++i) input_amax_ = std::max(input_amax_, std::fabs(static_cast<double>(x[i])));
  }
}

std::vector<Real> ReferenceCheck::fp8_quantized(Fp8Role role, const std::vector<Real>& x, int64_t rows,
                                                int64_t cols, double amax) const {
  const Fp8State& state = *model_.fp8();
  const Fp8Recipe& r = state.recipe();
  float scale = 1.0f;
  if (r.scaling == Fp8Scaling::kDelayed) {
    scale = state.scale(state.index(op_->linear, role));
  } else if (r.scaling == Fp8Scaling::kCurrent) {
    scale = reference::fp8_tensor_scale(amax, r.format(role), static_cast<int>(r.margin), r.power_of_two, 1.0f);
  }
  const QuantizeShape q = r.shape(role, Fp8Direction::kRowwise, rows, cols, scale);
  std::vector<Real> out(x.size());
  reference::quantize_fp8(rows, cols, {q.format, q.scaling, q.block_rows, q.block_cols, q.scale}, out.data(), x.data());
  return out;
}

void ReferenceCheck::check(const TensorView& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t width = out.shape[out.shape.rank() - 1];
  // The reference's own double roundings are counted into u (reference/bounded.hpp).
  reference::BoundedFormat own = reference::bounded_format();
  own.u = reference::kBoundedDoubleU;
  reference::ScopedBoundedFormat own_roundings(own);
  const auto param = [&](const std::string& name) -> std::vector<Real> {
    if (name.empty()) return {};
    const ParamTensor& p = model_.param(name);
    return to_real({model_.params() + p.offset, static_cast<size_t>(p.numel)});
  };
  // A bf16 linear reads its weight's bf16 copy and rounds its product; a norm or the activation
  // that a bf16 linear reads rounds its output.
  const bool bf16 = !op_->linear.empty() && recipe_.low_precision(op_->linear);
  const bool product = op_->kind == Kind::kLinear || op_->kind == Kind::kLinearResidual;
  std::vector<Real> x = to_real(inputs_.at(op_->inputs[0]));
  std::vector<Real> w = param(op_->weight);
  const std::vector<Real> b = param(op_->bias);
  if (bf16 && product) reference::round_to_bf16(static_cast<int64_t>(w.size()), w.data(), w.data());
  const Real* bias = b.empty() ? nullptr : b.data();
  std::vector<Real> y(static_cast<size_t>(rows_ * width));
  const auto in_width = static_cast<int64_t>(x.size()) / rows_;
  // An fp8 linear's fprop reads its input and weight quantized (src/model/fp8_linear.cpp) and
  // accumulates as the recipe says.
  Accumulation accumulation = Accumulation::kFp32;
  if (product && !op_->linear.empty() && recipe_.fp8_linear(op_->linear) && recipe_.fp8.fprop) {
    accumulation = recipe_.fp8.accumulation;
    double w_amax = 0;
    for (const Real& v : w) w_amax = std::max(w_amax, std::fabs(v.value));
    x = fp8_quantized(Fp8Role::kInput, x, rows_, in_width, input_amax_);
    w = fp8_quantized(Fp8Role::kWeight, w, static_cast<int64_t>(w.size()) / in_width, in_width, w_amax);
  }
  switch (op_->kind) {
    case Kind::kNorm: {
      std::vector<Real> mean(static_cast<size_t>(rows_)), rstd(mean.size());
      if (op_->norm == NormKind::kRmsNorm) {
        reference::rmsnorm_forward(rows_, width, op_->eps, y.data(), rstd.data(), x.data(), w.data());
      } else {
        reference::layernorm_forward(rows_, width, op_->eps, y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                     bias);
      }
      if (bf16) reference::round_to_bf16(rows_ * width, y.data(), y.data());
      break;
    }
    case Kind::kLinear:
      LS_CHECK(static_cast<int64_t>(w.size()) == in_width * width, "reference check: ", op_->weight, " holds ",
               w.size(), " elements for a ", in_width, " -> ", width, " product");
      reference::linear_forward(rows_, in_width, width, y.data(), x.data(), w.data(), bias, accumulation);
      if (bf16) reference::round_to_bf16(rows_ * width, y.data(), y.data());
      break;
    case Kind::kActivation:
      if (op_->ffn == FfnKind::kSwiglu) {
        reference::swiglu_forward(rows_, width, y.data(), x.data());
      } else {
        reference::gelu_forward(rows_ * width, y.data(), x.data());
      }
      if (bf16) reference::round_to_bf16(rows_ * width, y.data(), y.data());
      break;
    case Kind::kLinearResidual: {
      const std::vector<Real> stream = to_real(inputs_.at(op_->inputs[1]));
      reference::linear_forward(rows_, in_width, width, y.data(), x.data(), w.data(), bias, accumulation);
      if (bf16) reference::round_to_bf16(rows_ * width, y.data(), y.data());
      reference::residual_forward(rows_ * width, y.data(), y.data(), stream.data());
      break;
    }
  }
  const float* got = out.f32();
  for (int64_t i = 0; i < rows_ * width; ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - y[i].value);
    const double bound = std::nextafter(y[i].err, std::numeric_limits<double>::infinity());
    const double ratio = diff == 0 ? 0 : bound > 0 ? diff / bound : std::numeric_limits<double>::infinity();
    if (!(ratio <= ratio_)) {  // a NaN counts as the worst
      ratio_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
      worst_ = i;
    }
  }
  checked_ = true;
  ++stats_.checks;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ReferenceCheck::after_reduce(int64_t step, float) {
  if (!due_) return;
  due_ = false;
  LS_CHECK(op_ == nullptr || checked_, "reference check: the step showed no ", op_->output, " after its inputs");
  // A rank with no op to check (a pipeline stage without one) takes part with a pass.
  const std::string checked = op_ == nullptr ? std::string() : op_->output;
  op_ = nullptr;
  const uint64_t mine[2] = {ratio_ > 1 ? 1u : 0u, std::bit_cast<uint64_t>(ratio_)};
  const std::vector<uint64_t> all = agreed_all_gather(world_, mine);
  std::vector<int> ranks;
  double worst = 0;
  for (size_t r = 0; r < all.size() / 2; ++r) {
    if (all[2 * r] == 0) continue;
    ranks.push_back(static_cast<int>(r));
    worst = std::max(worst, std::bit_cast<double>(all[2 * r + 1]));
  }
  if (ranks.empty()) {
    stats_.max_ratio = std::max(stats_.max_ratio, ratio_);
    return;
  }
  // The ops the failing ranks checked (they differ between pipeline stages).
  const std::vector<std::string> ops = world_.all_gather_text(checked);
  std::vector<std::string> failed;
  for (int r : ranks) {
    const std::string& op = ops[static_cast<size_t>(r)];
    if (std::find(failed.begin(), failed.end(), op) == failed.end()) failed.push_back(op);
  }
  std::string sites;
  for (const std::string& op : failed) sites += (sites.empty() ? "" : ", ") + op;
  log_.report({.step = step + 1, .ranks = ranks, .detector = "reference",
               .site = str_cat(sites, " (", rows_, " rows of the first micro-batch)"), .magnitude = worst,
               .bound = 1, .unit = "error / bound", .classification = "kernel",
               .detail = str_cat("|trainer - reference| exceeds the op-local bound (Bounded<double> on the trainer's "
                                 "own inputs)", ratio_ > 1 ? str_cat("; rank 0's worst: element ", worst_, " of its rows") : "")},
              action_, kExitCorruption, "on_fault");
}

}  // namespace lockstep::detect
