#include "verify/detect/abft.hpp"

#include <algorithm>
#include <bit>
#include <map>

#include "src/core/check.hpp"
#include "verify/core/bounds.hpp"
#include "verify/detect/agreed.hpp"

namespace lockstep::detect {

namespace {

using Clock = std::chrono::steady_clock;

// What a product's row and column index are, for messages.
const char* row_meaning(GemmProduct p) { return p == GemmProduct::kWeightGrad ? "output feature" : "token"; }
const char* col_meaning(GemmProduct p) { return p == GemmProduct::kForward ? "output feature" : "input feature"; }

ProductView view_of(const GradSink& sink, int64_t M, int64_t N) {
  return {.f32 = sink.f32, .exact = sink.exact, .offset = sink.offset, .M = M, .N = N};
}

ProductView view_of(ExactAccumulator& acc, int64_t M, int64_t N) { return {.exact = &acc, .M = M, .N = N}; }

// The error a product of K terms may carry beyond its fp32 chain: the limited FP8 accumulator's.
double limited(LinearShape s, int64_t K) {
  if (s.accumulation != Accumulation::kHopperFp8) return 0;
  return bounds::limited_accumulation_bound(K, kFp8PromotionInterval, kFp8MmaGroup, kFp8AccumulatorFractionBits);
}

}  // namespace

std::string_view product_name(GemmProduct p) {
  switch (p) {
    case GemmProduct::kForward: return "forward";
    case GemmProduct::kInputGrad: return "dinp";
    case GemmProduct::kWeightGrad: return "dweight";
  }
  return "?";
}

void AbftBackend::name_weight(const float* data, int64_t numel, std::string name) {
  const int index = static_cast<int>(sites_.size()) / kGemmProducts;
  LS_CHECK(weights_.empty() || sites_.size() == weights_.size() * kGemmProducts, "weights are named first");
  for (int p = 0; p < kGemmProducts; ++p) {
    sites_.push_back(str_cat("gemm/", name, "/", product_name(static_cast<GemmProduct>(p))));
  }
  weights_.push_back({data, data + numel, index});
  memos_.resize(weights_.size() + 1);
  std::sort(weights_.begin(), weights_.end(), [](const Weight& a, const Weight& b) { return a.begin < b.begin; });
}

void AbftBackend::name_weights(const Model& model) {
  for (const ParamTensor& t : model.param_layout()) {
    if (t.shape.size() != 2) continue;
    name_weight(model.params() + t.offset, t.numel, t.name);
    // A bf16 linear's products are of the weight's bf16 copy: named the same.
    if (const float* copy = model.weight_copy(t)) name_weight(copy, t.numel, t.name);
    // An fp8 linear's products are of its quantized copies.
    for (const float* copy : model.fp8_weight_copies(t)) name_weight(copy, t.numel, t.name);
  }
}

int AbftBackend::site_of(const float* weight, GemmProduct p) const {
  auto it = std::upper_bound(weights_.begin(), weights_.end(), weight,
                             [](const float* w, const Weight& x) { return w < x.begin; });
  const int product = static_cast<int>(p);
  if (it == weights_.begin() || weight >= std::prev(it)->end) return -1 - product;  // unnamed
  return std::prev(it)->index * kGemmProducts + product;
}

AbftBackend::ForwardMemo& AbftBackend::memo(int site) {
  if (memos_.empty()) memos_.resize(1);
  return site < 0 ? memos_.back() : memos_[static_cast<size_t>(site / kGemmProducts)];
}

const std::string& AbftBackend::site_name(int site) const {
  static const std::string unnamed[kGemmProducts] = {"gemm/unnamed/forward", "gemm/unnamed/dinp",
                                                     "gemm/unnamed/dweight"};
  if (site < 0) return unnamed[-1 - site];
  return sites_.at(static_cast<size_t>(site));
}

AbftFault AbftBackend::take_worst() {
  AbftFault w = worst_;
  worst_ = {};
  return w;
}

// Adds the time from its making to its end to the checker's.
class AbftBackend::Timed {
 public:
  explicit Timed(double& seconds) : seconds_(seconds), t0_(Clock::now()) {}
  ~Timed() { seconds_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  double& seconds_;
  Clock::time_point t0_;
};

const OperandRowSums& AbftBackend::weight_rows(int site, const MatrixView& w) {
  const ForwardMemo& m = memo(site);
  if (site >= 0 && m.sums.w.size() == static_cast<size_t>(w.rows)) return m.sums;
  operand_row_sums(w, scratch_, fresh_.w, fresh_.w_mag);
  return fresh_;
}

const OperandRowSums& AbftBackend::input_rows(int site, const MatrixView& x) {
  const ForwardMemo& m = memo(site);
  if (site >= 0 && m.inp == x.data && m.N == x.rows) return m.sums;
  operand_row_sums(x, scratch_, fresh_.a, fresh_.a_mag);
  return fresh_;
}

void AbftBackend::checksums_before(const ProductView& c) {
  if (!check_) return;
  const Timed timed(stats_.seconds);
  observed_checksums(c, scratch_.before);
}

void AbftBackend::conclude(int site, const ProductView& c, const MatrixView& a, const MatrixView& b,
                           ProductRounding rounding, bool accumulates, const float* bias, ChecksumVector& predicted) {
  extra_.clear();
  if (bias != nullptr) {  // out = inp·Wᵀ + bias: every row adds Σ_j bias_j
    double sum = 0, mag = 0;
    for (int64_t j = 0; j < c.N; ++j) {
      sum += bias[j];
      mag += std::fabs(static_cast<double>(bias[j]));
    }
    for (double& r : predicted.sum) r += sum;
    extra_.assign(static_cast<size_t>(c.M), mag);
  }
  observed_checksums(c, scratch_.after, false);
  const ChecksumVerdict v =
      judge_checksums(scratch_.after, accumulates ? &scratch_.before : nullptr, predicted, c.N, rounding, extra_);
  ++stats_.checks;
  if (!v.fault) {
    stats_.max_clean_ratio = std::max(stats_.max_clean_ratio, v.ratio);
    return;
  }
  ++stats_.faults;
  if (!worst_.verdict.fault || v.ratio > worst_.verdict.ratio) {
    // The column: from the failed row recomputed, where C holds the product alone.
    const int64_t col = accumulates || c.f32 == nullptr ? -1 : locate_in_row(a, b, c.f32, v.index, bias);
    worst_ = {site, v, col};
  }
}

// A product whose result is rounded to bf16 (LinearShape::round_outputs) is checked before the
// rounding, which the checksums' bounds of an fp32 GEMM do not cover, and rounded after.
void AbftBackend::linear_forward(Mode mode, LinearShape s, float* out, const float* inp, const float* weight,
                                 const float* bias) {
  const int site = site_of(weight, GemmProduct::kForward);
  weight = as_read(s.round_weight, weight, s.OC * s.IC, rounded_weight_);
  inner().linear_forward(mode, unrounded(s), out, inp, weight, bias);
  check_forward(site, {.f32 = out, .M = s.N, .N = s.OC}, s, inp, weight, bias,
                rounding_chain(mode == Mode::kCanonical, s.IC, bias != nullptr), false);
  if (s.round_outputs) inner().round_to_bf16(s.N * s.OC, out, out);
}

void AbftBackend::check_forward(int site, const ProductView& c, LinearShape s, const float* inp, const float* weight,
                                const float* bias, int64_t chain, bool accumulates) {
  if (hook_) hook_(site_name(site), c);
  if (!check_) return;
  const Timed timed(stats_.seconds);
  ForwardMemo& m = memo(site);
  predicted_rows_times_transposed(inp, s.N, s.IC, weight, s.OC, scratch_, scratch_.predicted, m.sums);
  m.inp = inp, m.N = s.N;
  const ProductRounding rounding{.K = s.IC, .chain = chain, .limited = limited(s, s.IC)};
  conclude(site, c, {inp, s.N, s.IC}, {weight, s.OC, s.IC, true}, rounding, accumulates, bias, scratch_.predicted);
}

void AbftBackend::linear_backward(Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dweight,
                                  GradSink dbias, const float* dout, const float* inp, const float* weight) {
  const bool canonical = mode == Mode::kCanonical, has_dw = !dweight.empty();
  const ProductView dx = {.f32 = dinp, .M = s.N, .N = s.IC}, dw = view_of(dweight, s.OC, s.IC);
  if (has_dw) checksums_before(dw);
  const float* named_weight = weight;
  dout = as_read(s.round_dout, dout, s.N * s.OC, rounded_dout_);
  weight = as_read(s.round_weight, weight, s.OC * s.IC, rounded_weight_);
  inner().linear_backward(mode, unrounded(s), token_offset, dinp, dweight, dbias, dout, inp, weight);
  check_backward(canonical, s, dx, dw, dout, inp, weight, named_weight);
  if (s.round_outputs && dinp != nullptr) inner().round_to_bf16(s.N * s.IC, dinp, dinp);
}

const float* AbftBackend::as_read(bool& round, const float* x, int64_t n, std::vector<float>& copy) {
  if (!round || !check_) return x;
  round = false;
  if (copy.size() < static_cast<size_t>(n)) copy.resize(static_cast<size_t>(n));
  inner().round_to_bf16(n, copy.data(), x);
  return copy.data();
}

void AbftBackend::check_backward(bool canonical, LinearShape s, const ProductView& dx, const ProductView& dw,
                                 const float* dout, const float* inp, const float* weight,
                                 const float* named_weight) {
  const bool has_dw = dw.f32 != nullptr || dw.exact != nullptr;
  float* dinp = dx.f32;
  const int dx_site = site_of(named_weight, GemmProduct::kInputGrad);
  const int dw_site = site_of(named_weight, GemmProduct::kWeightGrad);
  if (hook_ && dinp != nullptr) hook_(site_name(dx_site), dx);
  if (hook_ && has_dw) hook_(site_name(dw_site), dw);
  if (!check_) return;
  const Timed timed(stats_.seconds);
  // dinp = dout·W needs W·e, dW += doutᵀ·inp needs inp·e: the forward's, where it fits.
  const MatrixView dout_m{dout, s.N, s.OC}, dout_t{dout, s.N, s.OC, true}, w{weight, s.OC, s.IC}, x{inp, s.N, s.IC};
  const OperandRowSums* bw = dinp != nullptr ? &weight_rows(dx_site, w) : nullptr;
  const OperandRowSums* bx = has_dw ? &input_rows(dx_site, x) : nullptr;
  // Both products read dout: once where both are computed.
  if (bw && bx) {
    predicted_rows_sharing_a(dout, s.N, s.OC, bw->w.data(), bw->w_mag.data(), bx->a.data(), bx->a_mag.data(),
                             scratch_, scratch_.predicted, scratch_.predicted2);
  } else if (bw) {
    predicted_rows_from(dout_m, bw->w.data(), bw->w_mag.data(), scratch_, scratch_.predicted);
  } else if (bx) {
    predicted_rows_from(dout_t, bx->a.data(), bx->a_mag.data(), scratch_, scratch_.predicted2);
  }
  if (bw) {
    const ProductRounding rounding{
        .K = s.OC, .chain = rounding_chain(canonical, s.OC, false), .limited = limited(s, s.OC)};
    conclude(dx_site, dx, dout_m, w, rounding, false, nullptr, scratch_.predicted);
  }
  if (bx) {
    // Canonical mode adds exact chunk partials (C before is in no rounding); fast mode's GEMM adds
    // the product onto the fp32 gradient (beta = 1).
    conclude(dw_site, dw, dout_t, x,
             {.K = s.N,
              .chain = rounding_chain(canonical, s.N, !canonical),
              .before_in_chain = !canonical,
              .limited = limited(s, s.N)},
             true,
             nullptr, scratch_.predicted2);
  }
}

void AbftBackend::linear_forward_partials(LinearShape s, ExactAccumulator& out, const float* inp,
                                          const float* weight) {
  const ProductView c = view_of(out, s.N, s.OC);
  checksums_before(c);
  const int site = site_of(weight, GemmProduct::kForward);
  weight = as_read(s.round_weight, weight, s.OC * s.IC, rounded_weight_);
  inner().linear_forward_partials(s, out, inp, weight);
  check_forward(site, c, s, inp, weight, nullptr, rounding_chain(true, s.IC, false),
                true);
}

void AbftBackend::linear_backward_dinp_partials(LinearShape s, ExactAccumulator& dinp, const float* dout,
                                                const float* weight) {
  const ProductView c = view_of(dinp, s.N, s.IC);
  checksums_before(c);
  const int site = site_of(weight, GemmProduct::kInputGrad);
  dout = as_read(s.round_dout, dout, s.N * s.OC, rounded_dout_);
  weight = as_read(s.round_weight, weight, s.OC * s.IC, rounded_weight_);
  inner().linear_backward_dinp_partials(s, dinp, dout, weight);
  if (hook_) hook_(site_name(site), c);
  if (!check_) return;
  const Timed timed(stats_.seconds);
  const MatrixView dout_m{dout, s.N, s.OC}, w{weight, s.OC, s.IC};
  const OperandRowSums& bw = weight_rows(site, w);
  predicted_rows_from(dout_m, bw.w.data(), bw.w_mag.data(), scratch_, scratch_.predicted);
  const ProductRounding rounding{.K = s.OC, .chain = rounding_chain(true, s.OC, false), .limited = limited(s, s.OC)};
  conclude(site, c, dout_m, w, rounding, true, nullptr, scratch_.predicted);
}

void AbftDetector::after_reduce(int64_t step, float) {
  const AbftFault mine = abft_.take_worst();
  // Per rank: the failed product (site + 1, 0: none), |observed − predicted|, its threshold, and
  // the element (row << 32 | column).
  const uint64_t packed[4] = {
      mine.verdict.fault ? static_cast<uint64_t>(static_cast<int64_t>(mine.site) + kGemmProducts + 1) : 0,
      std::bit_cast<uint64_t>(mine.verdict.diff), std::bit_cast<uint64_t>(mine.verdict.threshold),
      static_cast<uint64_t>(mine.verdict.index) << 32 | static_cast<uint32_t>(mine.col)};
  const std::vector<uint64_t> all = agreed_all_gather(world_, packed);
  // One finding per failed product, naming every rank where it failed (the first one's figures).
  std::map<uint64_t, std::vector<int>> by_site;
  for (int r = 0; r < world_.size(); ++r) {
    if (all[4 * static_cast<size_t>(r)] != 0) by_site[all[4 * static_cast<size_t>(r)]].push_back(r);
  }
  for (const auto& [code, ranks] : by_site) {
    const int site = static_cast<int>(static_cast<int64_t>(code) - kGemmProducts - 1);
    const size_t first = 4 * static_cast<size_t>(ranks.front());
    const double diff = std::bit_cast<double>(all[first + 1]), threshold = std::bit_cast<double>(all[first + 2]);
    const auto row = static_cast<int64_t>(all[first + 3] >> 32);
    const auto col = static_cast<int32_t>(all[first + 3] & 0xffffffffu);
    const auto product = static_cast<GemmProduct>(site < 0 ? -1 - site : site % kGemmProducts);
    log_.report({.step = step + 1, .ranks = ranks, .detector = "abft", .site = abft_.site_name(site),
                 .magnitude = diff, .bound = threshold, .unit = "|checksum - predicted|",
                 .classification = "corruption",
                 .detail = str_cat("the row checksum of ", row_meaning(product), " ", row, " fails",
                                   col >= 0 ? str_cat(", at ", col_meaning(product), " ", col) : std::string(),
                                   " of the product (this rank's shard); threshold derived from the operands "
                                   "(gamma bound of |A||B|)")},
                action_, kExitCorruption, "on_fault");
  }
}

}  // namespace lockstep::detect
