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

// An operand's stored matrix (its QuantizeShape's rows × cols) with the inverse scale of the block
// each element was quantized in.
class StoredOperand {
 public:
  explicit StoredOperand(const Fp8GemmOperand& o) : o_(o) {
    const QuantizeShape& s = o.shape;
    const bool whole = s.scaling == Fp8Scale::kPerTensor;
    br_ = whole ? std::max<int64_t>(s.rows, 1) : s.block_rows;
    bc_ = whole ? std::max<int64_t>(s.cols, 1) : s.block_cols;
    nbc_ = (s.cols + bc_ - 1) / bc_;
    const int64_t nbr = (s.rows + br_ - 1) / br_;
    inv_.resize(static_cast<size_t>(nbr * nbc_));
    for (int64_t b = 0; b < nbr * nbc_; ++b) {
      const int64_t r0 = b / nbc_ * br_, c0 = b % nbc_ * bc_;
      float amax = 0.0f;
      for (int64_t r = r0; !whole && r < std::min(r0 + br_, s.rows); ++r) {
        for (int64_t c = c0; c < std::min(c0 + bc_, s.cols); ++c) amax = std::max(amax, std::fabs(o.high[r * s.cols + c]));
      }
      inv_[static_cast<size_t>(b)] = fp8_inverse_scale(s, amax);
    }
  }
  // Stored row r (cols elements) and its elements' inverse scales.
  void row(int64_t r, float* high, float* quantized, float* inv) const {
    const int64_t cols = o_.shape.cols;
    std::copy(o_.high + r * cols, o_.high + (r + 1) * cols, high);
    std::copy(o_.quantized + r * cols, o_.quantized + (r + 1) * cols, quantized);
    for (int64_t c0 = 0; c0 < cols; c0 += bc_) {
      std::fill(inv + c0, inv + std::min(c0 + bc_, cols), inv_[static_cast<size_t>(r / br_ * nbc_ + c0 / bc_)]);
    }
  }
  // Stored column c (rows elements) likewise.
  void column(int64_t c, float* high, float* quantized, float* inv) const {
    const int64_t rows = o_.shape.rows, cols = o_.shape.cols;
    for (int64_t r = 0; r < rows; ++r) {
      high[r] = o_.high[r * cols + c];
      quantized[r] = o_.quantized[r * cols + c];
    }
    for (int64_t r0 = 0; r0 < rows; r0 += br_) {
      std::fill(inv + r0, inv + std::min(r0 + br_, rows), inv_[static_cast<size_t>(r0 / br_ * nbc_ + c / bc_)]);
    }
  }

 private:
  const Fp8GemmOperand& o_;
  int64_t br_ = 1, bc_ = 1, nbc_ = 1;
  std::vector<float> inv_;  // per block
};

// One k of the sampled row's sums, over its N columns (restrict parameters: the loop vectorises).
void accumulate_row(int64_t N, float a_h, float a_q, float ea, const float* __restrict bh, const float* __restrict bq,
                    const float* __restrict eb, float* __restrict obs, float* __restrict ref, float* __restrict var,
                    float* __restrict worst) {
  const float abs_ah = std::fabs(a_h);
  for (int64_t j = 0; j < N; ++j) {
    const float exact = a_h * bh[j];
    obs[j] += a_q * bq[j] - exact;
    ref[j] += exact;
    const float t = ea * std::fabs(bq[j]) + abs_ah * eb[j];
    var[j] += t * t;
    worst[j] += t;
  }
}

std::string fixed(double x, int digits) {
  std::ostringstream s;
  s << std::setprecision(digits) << x;
  return s.str();
}

}  // namespace

// In fp32: the sums' own rounding, about K·2^-24 of Σ|a||b|, stays far below the quantization
// error they measure (2^-4 or 2^-3 of each element, accumulating like √K). B is laid out K × N once
// (with each element's bound), A's sampled rows one at a time.
Fp8GemmCheck check_fp8_gemm(const Fp8GemmView& v, int64_t rows, double lambda) {
  const int64_t M = v.M, N = v.N, K = v.K;
  const FormatInfo& fa = fp8_info(v.a.shape.format);
  const FormatInfo& fb = fp8_info(v.b.shape.format);
  const auto unit_a = static_cast<float>(fa.unit_roundoff + 3 * kUnitF32), half_a = static_cast<float>(fa.min_subnormal / 2);
  const auto unit_b = static_cast<float>(fb.unit_roundoff + 3 * kUnitF32), half_b = static_cast<float>(fb.min_subnormal / 2);
  const StoredOperand A(v.a), B(v.b);
  // B(k, j) = stored (k, j), or stored (j, k): either way its stored rows, contiguous.
  std::vector<float> bh(static_cast<size_t>(K * N)), bq(bh.size()), eb(bh.size());
  const int64_t stored_rows = v.b.transposed ? N : K, stored_cols = v.b.transposed ? K : N;
#pragma omp parallel
  {
    std::vector<float> h(static_cast<size_t>(stored_cols)), q(h.size()), inv(h.size());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < stored_rows; ++r) {
      B.row(r, h.data(), q.data(), inv.data());
      for (int64_t c = 0; c < stored_cols; ++c) {
        const size_t at = static_cast<size_t>(v.b.transposed ? c * N + r : r * N + c);
        const auto x = static_cast<size_t>(c);
        bh[at] = h[x];
        bq[at] = q[x];
        eb[at] = unit_b * std::fabs(h[x]) + half_b * inv[x];
      }
    }
  }
  // The sampled rows over the threads; their results combined in row order.
  const int64_t R = std::min(rows, M);
  std::vector<Fp8GemmCheck> per_row(static_cast<size_t>(R));
  std::vector<double> obs_sq(per_row.size()), ref_sq(per_row.size());
#pragma omp parallel
  {
    std::vector<float> ah(static_cast<size_t>(K)), aq(ah.size()), ainv(ah.size());
    std::vector<float> obs(static_cast<size_t>(N)), ref(obs.size()), var(obs.size()), worst(obs.size());
#pragma omp for schedule(static)
    for (int64_t s = 0; s < R; ++s) {
      const int64_t i = s * M / R;
      // A(i, k) = stored (i, k), or stored (k, i): a stored row, or a column.
      if (v.a.transposed) {
        A.column(i, ah.data(), aq.data(), ainv.data());
      } else {
        A.row(i, ah.data(), aq.data(), ainv.data());
      }
      std::fill(obs.begin(), obs.end(), 0.0f);
      std::fill(ref.begin(), ref.end(), 0.0f);
      std::fill(var.begin(), var.end(), 0.0f);
      std::fill(worst.begin(), worst.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const float a_h = ah[static_cast<size_t>(k)], a_q = aq[static_cast<size_t>(k)];
        const float ea = unit_a * std::fabs(a_h) + half_a * ainv[static_cast<size_t>(k)];
        accumulate_row(N, a_h, a_q, ea, bh.data() + k * N, bq.data() + k * N, eb.data() + k * N, obs.data(),
                       ref.data(), var.data(), worst.data());
      }
      Fp8GemmCheck& c = per_row[static_cast<size_t>(s)];
      for (int64_t j = 0; j < N; ++j) {
        const auto at = static_cast<size_t>(j);
        const double err = std::fabs(static_cast<double>(obs[at]));
        if (!std::isfinite(err) || !std::isfinite(ref[at])) continue;  // the non-finite monitor's matter
        const double p = lambda * std::sqrt(static_cast<double>(var[at]));
        c.ratio = std::max(c.ratio, err == 0 ? 0.0 : (p > 0 ? err / p : INFINITY));
        c.worst_ratio = std::max(c.worst_ratio, err == 0 ? 0.0 : (worst[at] > 0 ? err / worst[at] : INFINITY));
        obs_sq[static_cast<size_t>(s)] += err * err;
        ref_sq[static_cast<size_t>(s)] += static_cast<double>(ref[at]) * ref[at];
        ++c.elements;
      }
    }
  }
  Fp8GemmCheck out;
  double obs_total = 0, ref_total = 0;
  for (size_t s = 0; s < per_row.size(); ++s) {
    out.ratio = std::max(out.ratio, per_row[s].ratio);
    out.worst_ratio = std::max(out.worst_ratio, per_row[s].worst_ratio);
    out.elements += per_row[s].elements;
    obs_total += obs_sq[s];
    ref_total += ref_sq[s];
  }
  out.rel_error = ref_total > 0 ? std::sqrt(obs_total / ref_total) : 0.0;
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
