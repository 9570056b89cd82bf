#include "verify/detect/fp8_sentinel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "kernels/ops/quantize.hpp"
#include "src/core/check.hpp"

namespace lockstep::detect {

namespace {

constexpr double kUnitF32 = 0x1p-24;

// An operand's stored elements with the error bound the recipe gives each.
class OperandBounds {
 public:
  explicit OperandBounds(const Fp8GemmOperand& o) : o_(o), f_(fp8_info(o.shape.format)) {
    const QuantizeShape& s = o.shape;
    if (s.scaling == Fp8Scale::kPerTensor) {
      br_ = std::max<int64_t>(s.rows, 1);
      bc_ = std::max<int64_t>(s.cols, 1);
    } else {
      br_ = s.block_rows;
      bc_ = s.block_cols;
    }
    nbc_ = (s.cols + bc_ - 1) / bc_;
    const int64_t nbr = (s.rows + br_ - 1) / br_;
    inv_.assign(static_cast<size_t>(nbr * nbc_), 0.0f);
    for (int64_t b = 0; b < nbr * nbc_; ++b) {
      const int64_t r0 = b / nbc_ * br_, c0 = b % nbc_ * bc_;
      float amax = 0.0f;
      if (s.scaling != Fp8Scale::kPerTensor) {
        for (int64_t r = r0; r < std::min(r0 + br_, s.rows); ++r) {
          for (int64_t c = c0; c < std::min(c0 + bc_, s.cols); ++c) amax = std::max(amax, std::fabs(high(r, c)));
        }
      }
      inv_[static_cast<size_t>(b)] = fp8_inverse_scale(s, amax);
    }
  }
  float high(int64_t r, int64_t c) const { return o_.high[r * o_.shape.cols + c]; }
  float quantized(int64_t r, int64_t c) const { return o_.quantized[r * o_.shape.cols + c]; }
  // e(a) of the stored element (r, c).
  double bound(int64_t r, int64_t c) const {
    const double inv = inv_[static_cast<size_t>(r / br_ * nbc_ + c / bc_)];
    return (f_.unit_roundoff + 3 * kUnitF32) * std::fabs(static_cast<double>(high(r, c))) + f_.min_subnormal / 2 * inv;
  }

 private:
  const Fp8GemmOperand& o_;
  const FormatInfo& f_;
  int64_t br_ = 1, bc_ = 1, nbc_ = 1;
  std::vector<float> inv_;  // per block
};

std::string fixed(double x, int digits) {
  std::ostringstream s;
  s << std::setprecision(digits) << x;
  return s.str();
}

}  // namespace

Fp8GemmCheck check_fp8_gemm(const Fp8GemmView& v, int64_t rows, double lambda) {
  const OperandBounds A(v.a), B(v.b);
  const int64_t M = v.M, N = v.N, K = v.K;
  // B as K × N, contiguous along j for the inner loop.
  std::vector<double> bh(static_cast<size_t>(K * N)), bq(bh.size()), eb(bh.size());
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < N; ++j) {
      const int64_t r = v.b.transposed ? j : k, c = v.b.transposed ? k : j;
      const size_t at = static_cast<size_t>(k * N + j);
      bh[at] = B.high(r, c);
      bq[at] = B.quantized(r, c);
      eb[at] = B.bound(r, c);
    }
  }
  Fp8GemmCheck out;
  const int64_t R = std::min(rows, M);
  std::vector<double> obs(static_cast<size_t>(N)), ref(obs.size()), var(obs.size()), worst(obs.size());
  double obs_sq = 0, ref_sq = 0;
  for (int64_t s = 0; s < R; ++s) {
    const int64_t i = s * M / R;
    std::fill(obs.begin(), obs.end(), 0.0);
    std::fill(ref.begin(), ref.end(), 0.0);
    std::fill(var.begin(), var.end(), 0.0);
    std::fill(worst.begin(), worst.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t r = v.a.transposed ? k : i, c = v.a.transposed ? i : k;
      const double ah = A.high(r, c), aq = A.quantized(r, c), ea = A.bound(r, c), abs_ah = std::fabs(ah);
      const double* bhk = bh.data() + k * N;
      const double* bqk = bq.data() + k * N;
      const double* ebk = eb.data() + k * N;
      for (int64_t j = 0; j < N; ++j) {
        const double exact = ah * bhk[j];
        obs[static_cast<size_t>(j)] += aq * bqk[j] - exact;
        ref[static_cast<size_t>(j)] += exact;
        const double t = ea * std::fabs(bqk[j]) + abs_ah * ebk[j];
        var[static_cast<size_t>(j)] += t * t;
        worst[static_cast<size_t>(j)] += t;
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      const auto at = static_cast<size_t>(j);
      const double err = std::fabs(obs[at]);
      if (!std::isfinite(err) || !std::isfinite(ref[at])) continue;  // the non-finite monitor's matter
      const double p = lambda * std::sqrt(var[at]);
      out.ratio = std::max(out.ratio, err == 0 ? 0.0 : (p > 0 ? err / p : INFINITY));
      out.worst_ratio = std::max(out.worst_ratio, err == 0 ? 0.0 : (worst[at] > 0 ? err / worst[at] : INFINITY));
      obs_sq += err * err;
      ref_sq += ref[at] * ref[at];
      ++out.elements;
    }
  }
  out.rel_error = ref_sq > 0 ? std::sqrt(obs_sq / ref_sq) : 0.0;
  return out;
}

Fp8Sentinel::Fp8Sentinel(Model& model, comm::Communicator& world, const Fp8SentinelRule& rule, FindingLog& log,
                         FaultAction action, std::function<void(const nlohmann::json&)> record, std::ostream& out)
    : model_(model), world_(world), rule_(rule), log_(log), action_(action), record_(std::move(record)), out_(out) {
  LS_CHECK(model.fp8() != nullptr, "the fp8 sentinel needs a model with fp8 linears");
  history_.resize(model.fp8()->size());
}

Fp8Sentinel::~Fp8Sentinel() { model_.set_fp8_tap({}); }

void Fp8Sentinel::begin_step(int64_t step) {
  checking_ = rule_.every > 0 && (step + 1) % rule_.every == 0;
  step_checks_.clear();
  if (!checking_) return;
  model_.set_fp8_tap([this](const Fp8GemmView& v) {
    const std::string key = v.linear + "/" + fp8_gemm_name(v.gemm);
    if (step_checks_.count(key) != 0) return;  // the first micro-batch's only
    const auto t0 = std::chrono::steady_clock::now();
    step_checks_[key] = check_fp8_gemm(v, rule_.rows, rule_.lambda);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}

void Fp8Sentinel::rolled_back(int64_t) {
  alarmed_.clear();
  streaks_.clear();
  for (auto& h : history_) h.clear();
}

std::string Fp8Sentinel::history_text(size_t i) const {
  const bool delayed = model_.fp8()->recipe().scaling == Fp8Scaling::kDelayed;
  std::string amax = "amax over the last steps", scale = "; scale";
  for (const auto& [a, s] : history_[i]) {
    amax += " " + fixed(a, 3);
    scale += " " + fixed(s, 4);
  }
  return delayed ? amax + scale : amax;
}

void Fp8Sentinel::judge_statistics(const StepRecord& r) {
  const Fp8State& state = *model_.fp8();
  const Fp8Recipe& recipe = state.recipe();
  for (size_t i = 0; i < state.size(); ++i) {
    const Fp8TensorStats& s = state.step_stats(i);
    auto& h = history_[i];
    h.emplace_back(s.amax, state.last_scale(i));
    while (static_cast<int64_t>(h.size()) > rule_.history) h.pop_front();
    if (s.numel == 0) continue;
    const Fp8Role role = state.role(i);
    const std::string what = str_cat(fp8_role_name(role), ", ", fp8_format_name(recipe.format(role)), ", recipe ",
                                     fp8_scaling_name(recipe.scaling));
    const auto judge = [&](const std::string& kind, double fraction, double threshold, bool applies,
                           const std::string& of) {
      const std::string key = state.name(i) + "/" + kind;
      if (!applies || !(fraction > threshold)) {
        streaks_.erase(key);
        return;
      }
      // Reported once, when it has lasted `patience` steps: delayed scaling corrects a one-step
      // jump of a tensor's range by itself at the next step.
      if (++streaks_[key] != rule_.patience) return;
      log_.report({.step = r.done(),
                   .detector = "fp8",
                   .site = "fp8/" + state.name(i),
                   .magnitude = fraction,
                   .bound = threshold,
                   .unit = of.empty() ? "error/bound (energy)" : "fraction of " + of + " " + kind,
                   .classification = "fp8 " + kind,
                   .detail = what + "; " + history_text(i)},
                  action_, kExitNumeric, "[verify] on_fp8");
    };
    judge("quantization error", s.error_ratio(), 1.0, true, "");
    judge("saturated", s.saturated_fraction(), rule_.saturation, true, "elements");
    judge("underflow", s.underflow_fraction(), rule_.underflow, state.last_scale_from_data(i), "non-zero elements");
  }
}

void Fp8Sentinel::judge_checks(const StepRecord& r) {
  // Every rank's checks of every GEMM, in one order: the fp8 linears' three GEMMs each.
  const Fp8State& state = *model_.fp8();
  std::vector<std::string> keys;
  for (size_t i = 0; i < state.size(); i += 3) {
    const std::string linear = state.name(i).substr(0, state.name(i).rfind('/'));
    for (Fp8Gemm g : {Fp8Gemm::kFprop, Fp8Gemm::kDgrad, Fp8Gemm::kWgrad}) keys.push_back(linear + "/" + fp8_gemm_name(g));
  }
  std::vector<double> values(3 * keys.size(), -1.0);
  for (size_t k = 0; k < keys.size(); ++k) {
    const auto it = step_checks_.find(keys[k]);
    if (it == step_checks_.end()) continue;
    values[3 * k] = it->second.ratio;
    values[3 * k + 1] = it->second.worst_ratio;
    values[3 * k + 2] = it->second.rel_error;
  }
  if (world_.size() > 1) world_.all_reduce(std::span<double>(values), comm::ReduceOp::kMax);
  ++checks_;
  nlohmann::json record = nlohmann::json::object();
  std::vector<std::pair<double, std::string>> ranked;
  for (size_t k = 0; k < keys.size(); ++k) {
    const double ratio = values[3 * k], worst = values[3 * k + 1], rel = values[3 * k + 2];
    if (ratio < 0) continue;  // not an fp8 GEMM here (fp8.gemms), or no rank ran it
    record[keys[k]] = {{"ratio", ratio}, {"worst_ratio", worst}, {"rel_error", rel}};
    ranked.emplace_back(rel, keys[k]);
    const std::string key = keys[k] + "/bound";
    if (!(ratio > 1)) {
      alarmed_.erase(key);
      continue;
    }
    if (!alarmed_.insert(key).second) continue;
    const std::string linear = keys[k].substr(0, keys[k].rfind('/'));
    std::string detail = str_cat("observed quantization error / probabilistic bound (lambda ", rule_.lambda,
                                 ", exceeded with probability < 2exp(-lambda^2/2) per element by clean roundings); ",
                                 "worst-case ratio ", fixed(worst, 3), ", relative error ", fixed(rel, 3), "; recipe ",
                                 fp8_scaling_name(state.recipe().scaling));
    for (Fp8Role role : kFp8Roles) {
      const size_t i = state.index(linear, role);
      detail += str_cat("; ", fp8_role_name(role), " ", history_text(i));
    }
    log_.report({.step = r.done(),
                 .detector = "fp8",
                 .site = "fp8/" + keys[k],
                 .magnitude = ratio,
                 .bound = 1,
                 .unit = "error/bound",
                 .classification = "fp8 quantization error",
                 .detail = detail},
                action_, kExitNumeric, "[verify] on_fp8");
  }
  std::sort(ranked.rbegin(), ranked.rend());
  out_ << "fp8 sentinel: step " << r.done() << ", quantization error relative to the bf16 product, largest first:";
  for (size_t k = 0; k < std::min<size_t>(3, ranked.size()); ++k) {
    out_ << (k == 0 ? " " : ", ") << ranked[k].second << " " << fixed(ranked[k].first, 3);
  }
  out_ << "\n";
  if (record_) record_({{"step", r.done()}, {"fp8_sentinel", record}});
}

void Fp8Sentinel::end_step(const StepRecord& r) {
  judge_statistics(r);
  if (!checking_) return;
  model_.set_fp8_tap({});
  judge_checks(r);
}

}  // namespace lockstep::detect
