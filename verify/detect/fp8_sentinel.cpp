#include "verify/detect/fp8_sentinel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include <omp.h>

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

// The sums of one output element (s, j) of a sampled row: the quantized product's difference from
// the bf16 one, the bf16 product, and the error bound's terms t = e(a)·|b̃| + |a|·e(b) squared and
// plain.
struct ElementSums {
  float* obs;
  float* ref;
  float* var;
  float* worst;
};

// Stored row k of a B read as is: every sampled row's sums move along its columns [j0, j1). The
// arrays of `sums` are (R, N); `a` holds the sampled rows' high, quantized and bound values (R, K).
void accumulate_k(int64_t R, int64_t N, int64_t K, int64_t k, int64_t j0, int64_t j1, const float* a_high,
                  const float* a_quantized, const float* a_bound, const float* __restrict bh, const float* __restrict bq,
                  const float* __restrict inv, float unit_b, float half_b, ElementSums sums) {
  for (int64_t s = 0; s < R; ++s) {
    const float ah = a_high[s * K + k], aq = a_quantized[s * K + k], ea = a_bound[s * K + k], abs_ah = std::fabs(ah);
    float* __restrict obs = sums.obs + s * N;
    float* __restrict ref = sums.ref + s * N;
    float* __restrict var = sums.var + s * N;
    float* __restrict worst = sums.worst + s * N;
    for (int64_t j = j0; j < j1; ++j) {
      const float exact = ah * bh[j];
      obs[j] += aq * bq[j] - exact;
      ref[j] += exact;
      const float eb = unit_b * std::fabs(bh[j]) + half_b * inv[j];
      const float t = ea * std::fabs(bq[j]) + abs_ah * eb;
      var[j] += t * t;
      worst[j] += t;
    }
  }
}

// One output element of a B stored transposed (its column j is stored row j): the four sums over k
// in eight interleaved lanes, so that the loop vectorises.
void dot_k(int64_t K, const float* __restrict ah, const float* __restrict aq, const float* __restrict ea,
           const float* __restrict bh, const float* __restrict bq, const float* __restrict eb, float out[4]) {
  constexpr int kLanes = 8;
  float obs[kLanes] = {}, ref[kLanes] = {}, var[kLanes] = {}, worst[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float exact = ah[k + l] * bh[k + l];
      obs[l] += aq[k + l] * bq[k + l] - exact;
      ref[l] += exact;
      const float t = ea[k + l] * std::fabs(bq[k + l]) + std::fabs(ah[k + l]) * eb[k + l];
      var[l] += t * t;
      worst[l] += t;
    }
  }
  for (; k < K; ++k) {
    const float exact = ah[k] * bh[k];
    obs[0] += aq[k] * bq[k] - exact;
    ref[0] += exact;
    const float t = ea[k] * std::fabs(bq[k]) + std::fabs(ah[k]) * eb[k];
    var[0] += t * t;
    worst[0] += t;
  }
  out[0] = out[1] = out[2] = out[3] = 0.0f;
  for (int l = 0; l < kLanes; ++l) {
    out[0] += obs[l];
    out[1] += ref[l];
    out[2] += var[l];
    out[3] += worst[l];
  }
}

std::string fixed(double x, int digits) {
  std::ostringstream s;
  s << std::setprecision(digits) << x;
  return s.str();
}

}  // namespace

// In fp32: the sums' own rounding, about K·2^-24 of Σ|a||b|, stays far below the quantization
// error they measure (2^-4 or 2^-3 of each element, accumulating like √K). B is read in place, as
// stored: a B read as is row k by row k (the columns over the threads), a B stored transposed row j
// by row j (a dot product with each sampled row of A).
Fp8GemmCheck check_fp8_gemm(const Fp8GemmView& v, int64_t rows, double lambda) {
  const int64_t M = v.M, N = v.N, K = v.K;
  const FormatInfo& fa = fp8_info(v.a.shape.format);
  const FormatInfo& fb = fp8_info(v.b.shape.format);
  const auto unit_a = static_cast<float>(fa.unit_roundoff + 3 * kUnitF32), half_a = static_cast<float>(fa.min_subnormal / 2);
  const auto unit_b = static_cast<float>(fb.unit_roundoff + 3 * kUnitF32), half_b = static_cast<float>(fb.min_subnormal / 2);
  const StoredOperand A(v.a), B(v.b);
  const int64_t R = std::min(rows, M);
  // A's sampled rows i = s·M/R: A(i, k) is stored (i, k), or stored (k, i) (a column).
  std::vector<float> ah(static_cast<size_t>(R * K)), aq(ah.size()), ea(ah.size());
  {
    std::vector<float> inv(static_cast<size_t>(K));
    for (int64_t s = 0; s < R; ++s) {
      const int64_t i = s * M / R;
      float* h = ah.data() + s * K;
      float* q = aq.data() + s * K;
      if (v.a.transposed) {
        A.column(i, h, q, inv.data());
      } else {
        A.row(i, h, q, inv.data());
      }
      for (int64_t k = 0; k < K; ++k) ea[static_cast<size_t>(s * K + k)] = unit_a * std::fabs(h[k]) + half_a * inv[static_cast<size_t>(k)];
    }
  }
  std::vector<float> obs(static_cast<size_t>(R * N), 0.0f), ref(obs.size(), 0.0f), var(obs.size(), 0.0f),
      worst(obs.size(), 0.0f);
  if (!v.b.transposed) {
#pragma omp parallel
    {
      std::vector<float> h(static_cast<size_t>(N)), q(h.size()), inv(h.size());
      // The columns split over the threads; each reads B's rows k in turn.
      const int threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t j0 = N * t / threads, j1 = N * (t + 1) / threads;
      for (int64_t k = 0; k < K && j0 < j1; ++k) {
        B.row(k, h.data(), q.data(), inv.data());
        accumulate_k(R, N, K, k, j0, j1, ah.data(), aq.data(), ea.data(), h.data(), q.data(), inv.data(), unit_b, half_b,
                     {obs.data(), ref.data(), var.data(), worst.data()});
      }
    }
  } else {
#pragma omp parallel
    {
      std::vector<float> h(static_cast<size_t>(K)), q(h.size()), inv(h.size()), eb(h.size());
#pragma omp for schedule(static)
      for (int64_t j = 0; j < N; ++j) {
        B.row(j, h.data(), q.data(), inv.data());
        for (int64_t k = 0; k < K; ++k) eb[static_cast<size_t>(k)] = unit_b * std::fabs(h[static_cast<size_t>(k)]) + half_b * inv[static_cast<size_t>(k)];
        for (int64_t s = 0; s < R; ++s) {
          float sums[4];
          dot_k(K, ah.data() + s * K, aq.data() + s * K, ea.data() + s * K, h.data(), q.data(), eb.data(), sums);
          const auto at = static_cast<size_t>(s * N + j);
          obs[at] = sums[0];
          ref[at] = sums[1];
          var[at] = sums[2];
          worst[at] = sums[3];
        }
      }
    }
  }
  Fp8GemmCheck out;
  double obs_sq = 0, ref_sq = 0;
  for (size_t at = 0; at < obs.size(); ++at) {
    const double err = std::fabs(static_cast<double>(obs[at]));
    if (!std::isfinite(err) || !std::isfinite(ref[at])) continue;  // the non-finite monitor's matter
    const double p = lambda * std::sqrt(static_cast<double>(var[at]));
    out.ratio = std::max(out.ratio, err == 0 ? 0.0 : (p > 0 ? err / p : INFINITY));
    out.worst_ratio = std::max(out.worst_ratio, err == 0 ? 0.0 : (worst[at] > 0 ? err / worst[at] : INFINITY));
    obs_sq += err * err;
    ref_sq += static_cast<double>(ref[at]) * ref[at];
    ++out.elements;
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
    amax += str_cat(" ", fixed(a, 3));
    scale += str_cat(" ", fixed(s, 4));
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
