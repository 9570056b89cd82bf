// One case type for every op of kernels/ops/ops.def (op_case.hpp's frame): its dims at each size
// class, the values each operand takes, the backend call, and the references its outputs must
// match. make_op_case(name, spec) builds the case of an op by its name in ops.def; ops.def's
// X-macro expands to one make_<op> each, so an op listed there without a case here does not
// compile.
//
// Conventions: canonical-mode references are the templated reference ops instantiated with
// CanonicalF32 (bit for bit), bounds come from the same ops over Bounded<double> (the caller sets
// reference::kBoundedDoubleU so that the reference's own double roundings are covered); parameter
// gradients start at zero and token offsets at 0; an op's cached inputs (norm statistics, the
// attention probabilities) are the backend's own forward outputs, so that a backward is checked as
// a function of its inputs. The split pieces (linear partials, the vocabulary-parallel
// cross-entropy) are checked through their contract: combined over two chunk-aligned slices they
// give the unsplit op.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reference/activation.hpp"
#include "reference/attention.hpp"
#include "reference/cast.hpp"
#include "reference/crossentropy.hpp"
#include "reference/embedding.hpp"
#include "reference/linear.hpp"
#include "reference/norm.hpp"
#include "reference/optim.hpp"
#include "reference/quantize.hpp"
#include "reference/real.hpp"
#include "tests/support/op_case.hpp"

namespace lockstep::test {

using Bd = reference::Bounded<double>;
using Cf = reference::CanonicalF32;
using reference::GradOut;
using reference::GradStore;

// A dimension per size class: {one, prime, odd, long, bench_small, bench_medium}.
inline int64_t dim(SizeClass s, std::initializer_list<int64_t> per_class) {
  return per_class.begin()[static_cast<int>(s)];
}

// The chunk-aligned cut of [0, n) into two slices a split op is checked with (n itself when the
// range is a single chunk).
inline int64_t chunk_cut(int64_t n, int64_t chunk = kCanonicalChunk) { return n > chunk ? (n / 2 / chunk + 1) * chunk : n; }

// How a linear case's products accumulate: every third seed, as the GEMMs of an fp8 linear under
// the Hopper accumulator (kernels/ops/fp8_accumulation.hpp), whose chunks are its promotion intervals.
inline Accumulation accumulation_of(const CaseSpec& c) {
  return c.seed % 3 == 0 ? Accumulation::kHopperFp8 : Accumulation::kFp32;
}
inline std::string accumulation_text(Accumulation a) { return a == Accumulation::kHopperFp8 ? " hopper" : ""; }
inline int64_t chunk_of(Accumulation a) { return a == Accumulation::kHopperFp8 ? kFp8PromotionInterval : kCanonicalChunk; }

// Columns [c0, c1) of a row-major (rows, cols) matrix.
inline std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), m.begin() + r * cols + c0, m.begin() + r * cols + c1);
  return out;
}

// A check of one output: the Bounded reference always, CanonicalF32 in canonical mode.
inline Check check_of(std::string what, std::vector<float> got, std::vector<Bd> bounded, Mode mode,
                      const std::function<std::vector<float>()>& exact) {
  Check c{std::move(what), std::move(got), std::move(bounded), {}};
  if (mode == Mode::kCanonical && exact) c.exact = exact();
  return c;
}

// ---- linear.hpp

class LinearForward final : public OpCase {
 public:
  explicit LinearForward(const CaseSpec& c)
      : s_{dim(c.size, {1, 7, 9, 3, 1024, 1024}), dim(c.size, {1, 61, 33, 1031, 256, 512}), dim(c.size, {1, 13, 15, 5, 1024, 2048})} {
    s_.accumulation = accumulation_of(c);
    Draw d(c);
    inp_ = d.values(s_.N * s_.IC, 100, true);
    w_ = d.values(s_.OC * s_.IC);
    b_ = d.values(s_.OC);
    out_.assign(static_cast<size_t>(s_.N * s_.OC), -1.0f);
  }
  std::string shape() const override {
    return dims_text({{"N", s_.N}, {"IC", s_.IC}, {"OC", s_.OC}}) + accumulation_text(s_.accumulation);
  }
  double flops() const override { return 2.0 * static_cast<double>(s_.N * s_.IC * s_.OC); }
  void run(Backend& be, Mode mode) override { be.linear_forward(mode, s_, out_.data(), inp_.data(), w_.data(), b_.data()); }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", out_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(out_.size());
    const auto i = as<Real>(inp_), w = as<Real>(w_), b = as<Real>(b_);
    reference::linear_forward(s_.N, s_.IC, s_.OC, out.data(), i.data(), w.data(), b.data(), s_.accumulation);
    return out;
  }
  LinearShape s_;
  std::vector<float> inp_, w_, b_, out_;
};

class LinearBackward final : public OpCase {
 public:
  explicit LinearBackward(const CaseSpec& c)
      : s_{dim(c.size, {1, 7, 9, 3, 1024, 1024}), dim(c.size, {1, 61, 33, 1031, 256, 512}), dim(c.size, {1, 13, 15, 5, 1024, 2048})},
        dw_(s_.OC * s_.IC), db_(s_.OC) {
    s_.accumulation = accumulation_of(c);
    Draw d(c);
    dout_ = d.values(s_.N * s_.OC, 0, true);
    inp_ = d.values(s_.N * s_.IC, 100);
    w_ = d.values(s_.OC * s_.IC);
    dinp_.assign(static_cast<size_t>(s_.N * s_.IC), -1.0f);
  }
  std::string shape() const override {
    return dims_text({{"N", s_.N}, {"IC", s_.IC}, {"OC", s_.OC}}) + accumulation_text(s_.accumulation);
  }
  double flops() const override { return 4.0 * static_cast<double>(s_.N * s_.IC * s_.OC); }
  void run(Backend& be, Mode mode) override {
    mode_ = mode;
    be.linear_backward(mode, s_, 0, dinp_.data(), dw_.sink(mode), db_.sink(mode), dout_.data(), inp_.data(), w_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref<Bd>();
    std::vector<Check> out;
    const char* names[] = {"dinp", "dweight", "dbias"};
    const std::vector<float>* got[] = {&dinp_, nullptr, nullptr};
    for (int k = 0; k < 3; ++k) {
      std::vector<float> g = k == 0 ? *got[0] : (k == 1 ? dw_.values(mode_) : db_.values(mode_));
      out.push_back(check_of(names[k], std::move(g), b[static_cast<size_t>(k)], mode, [&] { return floats(ref<Cf>()[static_cast<size_t>(k)]); }));
    }
    return out;
  }

 private:
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    std::vector<Real> dinp(dinp_.size());
    GradStore<Real> dw, db;
    dw.reset(s_.OC * s_.IC);
    db.reset(s_.OC);
    const auto o = as<Real>(dout_), i = as<Real>(inp_), w = as<Real>(w_);
    reference::linear_backward(s_.N, s_.IC, s_.OC, dinp.data(), dw.out(0), db.out(0), o.data(), i.data(), w.data(),
                               s_.accumulation);
    dw.finish();
    db.finish();
    return {dinp, dw.g, db.g};
  }
  LinearShape s_;
  std::vector<float> dout_, inp_, w_, dinp_;
  GradBuffer dw_, db_;
  Mode mode_ = Mode::kCanonical;
};

// The split pieces of linear.hpp over two chunk-aligned slices of the reduced dim into one exact
// sum, rounded once: linear_forward_partials over IC gives the unsplit product (without bias),
// linear_backward_dinp_partials over OC the unsplit dinp.
class LinearPartials final : public OpCase {
 public:
  LinearPartials(const CaseSpec& c, bool dinp)
      : dinp_(dinp), N_(dim(c.size, {1, 7, 9, 3, 1024, 1024})), K_(dim(c.size, {1, 67, 131, 1031, 1024, 2048})),
        M_(dim(c.size, {1, 13, 15, 5, 256, 512})), accumulation_(accumulation_of(c)) {
    Draw d(c);
    a_ = d.values(N_ * K_, dinp_ ? 0 : 100, true);
    w_ = d.values(M_ * K_, dinp_ ? 100 : 0);
    cut_ = chunk_cut(K_, chunk_of(accumulation_));
  }
  std::string shape() const override {
    return dims_text({{"N", N_}, {dinp_ ? "OC" : "IC", K_}, {dinp_ ? "IC" : "OC", M_}, {"cut", cut_}}) +
           accumulation_text(accumulation_);
  }
  // a: (N, K) rows of inputs (forward) or output gradients (dinp); w: (M, K) forward, (K, M) dinp.
  void run(Backend& be, Mode) override {
    ExactAccumulator acc(static_cast<size_t>(N_ * M_));
    for (const auto& [k0, k1] : {std::pair{int64_t{0}, cut_}, std::pair{cut_, K_}}) {
      if (k1 == k0) continue;
      const auto a = columns(a_, N_, K_, k0, k1);
      if (dinp_) {
        const std::vector<float> w(w_.begin() + k0 * M_, w_.begin() + k1 * M_);
        be.linear_backward_dinp_partials({.N = N_, .IC = M_, .OC = k1 - k0, .accumulation = accumulation_}, acc,
                                         a.data(), w.data());
      } else {
        const auto w = columns(w_, M_, K_, k0, k1);
        be.linear_forward_partials({.N = N_, .IC = k1 - k0, .OC = M_, .accumulation = accumulation_}, acc, a.data(),
                                   w.data());
      }
    }
    out_.resize(acc.size());
    acc.round_to(out_.data());
  }
  std::vector<Check> checks(Mode) const override {
    return {check_of(dinp_ ? "dinp" : "out", out_, ref<Bd>(), Mode::kCanonical, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(static_cast<size_t>(N_ * M_));
    const auto a = as<Real>(a_), w = as<Real>(w_);
    if (dinp_) {
      const std::vector<Real> inp(out.size());
      reference::linear_backward(N_, M_, K_, out.data(), GradOut<Real>{}, GradOut<Real>{}, a.data(), inp.data(),
                                 w.data(), accumulation_);
    } else {
      reference::linear_forward(N_, K_, M_, out.data(), a.data(), w.data(), static_cast<const Real*>(nullptr),
                                accumulation_);
    }
    return out;
  }
  bool dinp_;
  int64_t N_, K_, M_;  // rows, the reduced dim, the other dim
  Accumulation accumulation_;
  int64_t cut_ = 0;
  std::vector<float> a_, w_, out_;
};

// ---- norm.hpp (LayerNorm and RMSNorm: the same frame, `layer` says which)

class NormCase : public OpCase {
 public:
  NormCase(const CaseSpec& c, bool layer)
      : layer_(layer), s_{dim(c.size, {1, 5, 9, 3, 1024, 1024}), dim(c.size, {1, 67, 45, 1031, 256, 512}), 1e-5f},
        dw_(s_.C), db_(s_.C) {
    Draw d(c);
    inp_ = d.values(s_.N * s_.C, 40, true);
    w_ = d.values(s_.C);
    b_ = d.values(s_.C);
    dout_ = d.values(s_.N * s_.C);
    dinp0_ = d.values(s_.N * s_.C);
    out_.assign(inp_.size(), -1.0f);
    mean_.assign(static_cast<size_t>(s_.N), -1.0f);
    rstd_ = mean_;
  }
  std::string shape() const override { return dims_text({{"N", s_.N}, {"C", s_.C}}); }
  double bytes() const override { return 4.0 * 3 * static_cast<double>(s_.N * s_.C); }

 protected:
  void forward(Backend& be, Mode mode) {
    if (layer_) {
      be.layernorm_forward(mode, s_, out_.data(), mean_.data(), rstd_.data(), inp_.data(), w_.data(), b_.data());
    } else {
      be.rmsnorm_forward(mode, s_, out_.data(), rstd_.data(), inp_.data(), w_.data());
    }
  }
  template <class Real>
  std::vector<std::vector<Real>> ref_forward() const {
    std::vector<Real> out(out_.size()), mean(mean_.size()), rstd(rstd_.size());
    const auto i = as<Real>(inp_), w = as<Real>(w_), b = as<Real>(b_);
    if (layer_) {
      reference::layernorm_forward(s_.N, s_.C, s_.eps, out.data(), mean.data(), rstd.data(), i.data(), w.data(), b.data());
    } else {
      reference::rmsnorm_forward(s_.N, s_.C, s_.eps, out.data(), rstd.data(), i.data(), w.data());
    }
    return {out, mean, rstd};
  }
  // Backward from the backend's own forward statistics (mean_, rstd_), dinp accumulating into dinp0.
  template <class Real>
  std::vector<std::vector<Real>> ref_backward() const {
    auto dinp = as<Real>(dinp0_);
    GradStore<Real> dw, db;
    dw.reset(s_.C);
    db.reset(s_.C);
    const auto o = as<Real>(dout_), i = as<Real>(inp_), w = as<Real>(w_), m = as<Real>(mean_), r = as<Real>(rstd_);
    if (layer_) {
      reference::layernorm_backward(s_.N, s_.C, dinp.data(), dw.out(0), db.out(0), o.data(), i.data(), w.data(),
                                    m.data(), r.data());
    } else {
      reference::rmsnorm_backward(s_.N, s_.C, dinp.data(), dw.out(0), o.data(), i.data(), w.data(), r.data());
    }
    dw.finish();
    db.finish();
    return {dinp, dw.g, db.g};
  }

  bool layer_;
  NormShape s_;
  std::vector<float> inp_, w_, b_, dout_, dinp0_, out_, mean_, rstd_, dinp_;
  GradBuffer dw_, db_;
  Mode mode_ = Mode::kCanonical;
};

class NormForward final : public NormCase {
 public:
  using NormCase::NormCase;
  void run(Backend& be, Mode mode) override { forward(be, mode); }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref_forward<Bd>();
    std::vector<Check> out{check_of("out", out_, b[0], mode, [&] { return floats(ref_forward<Cf>()[0]); })};
    if (layer_) out.push_back(check_of("mean", mean_, b[1], mode, [&] { return floats(ref_forward<Cf>()[1]); }));
    out.push_back(check_of("rstd", rstd_, b[2], mode, [&] { return floats(ref_forward<Cf>()[2]); }));
    return out;
  }
};

class NormBackward final : public NormCase {
 public:
  using NormCase::NormCase;
  void run(Backend& be, Mode mode) override {
    if (dinp_.empty()) forward(be, Mode::kCanonical);  // the statistics the backward reads
    mode_ = mode;
    dinp_ = dinp0_;
    if (layer_) {
      be.layernorm_backward(mode, s_, 0, dinp_.data(), dw_.sink(mode), db_.sink(mode), dout_.data(), inp_.data(),
                            w_.data(), mean_.data(), rstd_.data());
    } else {
      be.rmsnorm_backward(mode, s_, 0, dinp_.data(), dw_.sink(mode), dout_.data(), inp_.data(), w_.data(),
                          rstd_.data());
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref_backward<Bd>();
    std::vector<Check> out{check_of("dinp", dinp_, b[0], mode, [&] { return floats(ref_backward<Cf>()[0]); }),
                           check_of("dweight", dw_.values(mode_), b[1], mode, [&] { return floats(ref_backward<Cf>()[1]); })};
    if (layer_) {
      out.push_back(check_of("dbias", db_.values(mode_), b[2], mode, [&] { return floats(ref_backward<Cf>()[2]); }));
    }
    return out;
  }
};

// ---- attention.hpp

inline AttentionShape attention_shape(SizeClass s) {
  return {dim(s, {1, 1, 2, 1, 8, 4}), dim(s, {1, 7, 9, 130, 128, 256}), dim(s, {1, 2, 3, 2, 4, 8}),
          dim(s, {1, 1, 3, 1, 4, 8}), dim(s, {1, 5, 3, 8, 64, 64})};
}

inline std::string attention_text(const AttentionShape& s) {
  return dims_text({{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"NKV", s.NKV}, {"HS", s.HS}});
}

class AttentionCase : public OpCase {
 public:
  explicit AttentionCase(const CaseSpec& c) : s_(attention_shape(c.size)) {
    Draw d(c);
    qkv_ = d.values(s_.B * s_.T * row(), 20, true);
    dout_ = d.values(s_.B * s_.T * s_.NH * s_.HS);
    out_.assign(static_cast<size_t>(s_.B * s_.T * s_.NH * s_.HS), -1.0f);
    att_.assign(static_cast<size_t>(s_.B * s_.NH * s_.T * s_.T), -1.0f);
  }
  std::string shape() const override { return attention_text(s_); }
  double flops() const override {
    return 2.0 * static_cast<double>(s_.B * s_.NH * s_.T * s_.T * s_.HS);  // scores and values, causal
  }

 protected:
  int64_t row() const { return (s_.NH + 2 * s_.NKV) * s_.HS; }
  template <class Real>
  std::vector<std::vector<Real>> ref_forward() const {
    std::vector<Real> out(out_.size()), att(att_.size());
    const auto q = as<Real>(qkv_);
    reference::attention_forward(s_.B, s_.T, s_.NH, s_.NKV, s_.HS, out.data(), att.data(), q.data());
    return {out, att};
  }
  AttentionShape s_;
  std::vector<float> qkv_, dout_, out_, att_, dqkv_;
};

class AttentionForward final : public AttentionCase {
 public:
  using AttentionCase::AttentionCase;
  void run(Backend& be, Mode mode) override { be.attention_forward(mode, s_, out_.data(), att_.data(), qkv_.data()); }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref_forward<Bd>();
    return {check_of("out", out_, b[0], mode, [&] { return floats(ref_forward<Cf>()[0]); }),
            check_of("att", att_, b[1], mode, [&] { return floats(ref_forward<Cf>()[1]); })};
  }
};

class AttentionBackward final : public AttentionCase {
 public:
  using AttentionCase::AttentionCase;
  void run(Backend& be, Mode mode) override {
    if (dqkv_.empty()) be.attention_forward(Mode::kCanonical, s_, out_.data(), att_.data(), qkv_.data());
    dqkv_.assign(qkv_.size(), -1.0f);
    scratch_.resize(att_.size());
    be.attention_backward(mode, s_, dqkv_.data(), scratch_.data(), dout_.data(), qkv_.data(), att_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("dqkv", dqkv_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  // From the backend's own probabilities att_.
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> dqkv(qkv_.size()), scratch(att_.size());
    const auto q = as<Real>(qkv_), o = as<Real>(dout_), a = as<Real>(att_);
    reference::attention_backward(s_.B, s_.T, s_.NH, s_.NKV, s_.HS, dqkv.data(), scratch.data(), o.data(), q.data(),
                                  a.data());
    return dqkv;
  }
  std::vector<float> scratch_;
};

// The _rows variants (context parallelism): one block of 64 query rows of each sequence, in the
// middle of T where T allows (keys before and after the block both exist), checked against the
// rows of the whole op's reference.
class AttentionRowsCase : public OpCase {
 public:
  explicit AttentionRowsCase(const CaseSpec& c) : s_(attention_shape(c.size)) {
    s_.T = dim(c.size, {64, 64, 128, 192, 128, 256});
    rows_ = {s_.T / 2 / kCanonicalChunk * kCanonicalChunk, kCanonicalChunk};
    Draw d(c);
    qkv_ = d.values(s_.B * s_.T * row(), 20);
    // A nonfinite case's NaN or ±inf where the call reads it: a q of its rows, or a k or v before them.
    const std::vector<float> special = d.values(1, 0, true);
    const int64_t b = static_cast<int64_t>(d.below(static_cast<uint64_t>(s_.B)));
    const int64_t t = rows_.first + static_cast<int64_t>(d.below(static_cast<uint64_t>(rows_.count)));
    const int64_t at = d.below(2) == 0 ? (b * s_.T + t) * row() + static_cast<int64_t>(d.below(static_cast<uint64_t>(s_.NH * s_.HS)))
                                      : (b * s_.T + static_cast<int64_t>(d.below(static_cast<uint64_t>(t + 1)))) * row() +
                                            s_.NH * s_.HS + static_cast<int64_t>(d.below(static_cast<uint64_t>(2 * s_.NKV * s_.HS)));
    qkv_[static_cast<size_t>(at)] = special[0];
    dout_ = d.values(s_.B * rows_.count * s_.NH * s_.HS);
    out_.assign(static_cast<size_t>(s_.B * rows_.count * s_.NH * s_.HS), -1.0f);
    att_.assign(static_cast<size_t>(s_.B * s_.NH * rows_.count * s_.T), -1.0f);
  }
  std::string shape() const override {
    return attention_text(s_) + dims_text({{" rows from", rows_.first}, {"count", rows_.count}});
  }
  double flops() const override {
    return 2.0 * static_cast<double>(s_.B * s_.NH * rows_.count * (rows_.first + rows_.count) * s_.HS);
  }

 protected:
  int64_t row() const { return (s_.NH + 2 * s_.NKV) * s_.HS; }
  // Rows [first, first + count) of each of `seqs` (rows, width) blocks of v.
  template <class V>
  V rows_of(const V& v, int64_t seqs, int64_t rows, int64_t width) const {
    V out;
    for (int64_t b = 0; b < seqs; ++b) {
      auto from = v.begin() + (b * rows + rows_.first) * width;
      out.insert(out.end(), from, from + rows_.count * width);
    }
    return out;
  }
  template <class Real>
  std::vector<std::vector<Real>> ref_forward() const {
    std::vector<Real> out(static_cast<size_t>(s_.B * s_.T * s_.NH * s_.HS)), att(static_cast<size_t>(s_.B * s_.NH * s_.T * s_.T));
    const auto q = as<Real>(qkv_);
    reference::attention_forward(s_.B, s_.T, s_.NH, s_.NKV, s_.HS, out.data(), att.data(), q.data());
    return {rows_of(out, s_.B, s_.T, s_.NH * s_.HS), rows_of(att, s_.B * s_.NH, s_.T, s_.T)};
  }
  // dk (scaled once) and dv as (B, T, NKV·HS) from their sums [dk | dv], each (B, NKV, T, HS).
  std::pair<std::vector<float>, std::vector<float>> key_grads(const std::vector<float>& sums) const {
    const int64_t KV = s_.NKV * s_.HS;
    std::vector<float> dk(static_cast<size_t>(s_.B * s_.T * KV)), dv(dk.size());
    const float scale = attention_scale(s_.HS);
    for (int64_t b = 0; b < s_.B; ++b) {
      for (int64_t g = 0; g < s_.NKV; ++g) {
        for (int64_t t = 0; t < s_.T; ++t) {
          for (int64_t d = 0; d < s_.HS; ++d) {
            const size_t from = static_cast<size_t>(((b * s_.NKV + g) * s_.T + t) * s_.HS + d);
            const size_t to = static_cast<size_t>((b * s_.T + t) * KV + g * s_.HS + d);
            dk[to] = sums[from] * scale;
            dv[to] = sums[from + dk.size()];
          }
        }
      }
    }
    return {dk, dv};
  }
  // The checks of a backward's dq, dk and dv (got), against the references from the rows'
  // probabilities: Bounded ones always, CanonicalF32 ones (made only in canonical mode) by `exact_att`.
  std::vector<Check> backward_checks(Mode mode, const std::vector<std::vector<float>>& got, const std::vector<Bd>& att,
                                     const std::function<std::vector<Cf>()>& exact_att) const {
    const auto b = ref_backward<Bd>(att);
    const auto exact = [&](int i) { return floats(ref_backward<Cf>(exact_att())[static_cast<size_t>(i)]); };
    return {check_of("dq", got[0], b[0], mode, [&] { return exact(0); }),
            check_of("dk", got[1], b[1], mode, [&] { return exact(1); }),
            check_of("dv", got[2], b[2], mode, [&] { return exact(2); })};
  }
  // dq of the rows, and dk, dv (B, T, NKV·HS) from the rows' pairs alone, given the rows'
  // probabilities (B, NH, rows, T): the whole op on the sequence's first first + count positions
  // with q, dout and the probabilities of the rows before the block zeroed.
  template <class Real>
  std::vector<std::vector<Real>> ref_backward(const std::vector<Real>& att_rows) const {
    const int64_t T1 = rows_.first + rows_.count, Q = s_.NH * s_.HS, KV = s_.NKV * s_.HS;
    std::vector<float> qkv(static_cast<size_t>(s_.B * T1 * row())), dout(static_cast<size_t>(s_.B * T1 * Q), 0.0f);
    std::vector<Real> att(static_cast<size_t>(s_.B * s_.NH * T1 * T1), Real(0));
    for (int64_t b = 0; b < s_.B; ++b) {
      std::copy_n(qkv_.begin() + b * s_.T * row(), T1 * row(), qkv.begin() + b * T1 * row());
      for (int64_t t = 0; t < rows_.first; ++t) std::fill_n(qkv.begin() + (b * T1 + t) * row(), Q, 0.0f);
      std::copy_n(dout_.begin() + b * rows_.count * Q, rows_.count * Q, dout.begin() + (b * T1 + rows_.first) * Q);
      for (int64_t h = 0; h < s_.NH; ++h) {
        for (int64_t t = 0; t < rows_.count; ++t) {
          std::copy_n(att_rows.begin() + ((b * s_.NH + h) * rows_.count + t) * s_.T, T1,
                      att.begin() + ((b * s_.NH + h) * T1 + rows_.first + t) * T1);
        }
      }
    }
    std::vector<Real> dqkv(qkv.size()), scratch(att.size());
    const auto q = as<Real>(qkv), o = as<Real>(dout);
    reference::attention_backward(s_.B, T1, s_.NH, s_.NKV, s_.HS, dqkv.data(), scratch.data(), o.data(), q.data(), att.data());
    std::vector<Real> dq, dk(static_cast<size_t>(s_.B * s_.T * KV), Real(0)), dv(dk.size(), Real(0));
    for (int64_t b = 0; b < s_.B; ++b) {
      for (int64_t t = 0; t < T1; ++t) {
        auto r = dqkv.begin() + (b * T1 + t) * row();
        if (t >= rows_.first) dq.insert(dq.end(), r, r + Q);
        std::copy_n(r + Q, KV, dk.begin() + (b * s_.T + t) * KV);
        std::copy_n(r + Q + KV, KV, dv.begin() + (b * s_.T + t) * KV);
      }
    }
    return {dq, dk, dv};
  }
  AttentionShape s_;
  QueryRows rows_;
  std::vector<float> qkv_, dout_, out_, att_;
};

class AttentionForwardRows final : public AttentionRowsCase {
 public:
  using AttentionRowsCase::AttentionRowsCase;
  void run(Backend& be, Mode mode) override {
    be.attention_forward_rows(mode, s_, rows_, out_.data(), att_.data(), qkv_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref_forward<Bd>();
    return {check_of("out", out_, b[0], mode, [&] { return floats(ref_forward<Cf>()[0]); }),
            check_of("att", att_, b[1], mode, [&] { return floats(ref_forward<Cf>()[1]); })};
  }
};

// dq of the rows, and dk, dv of every key from the rows' pairs alone (rounded once, dk scaled):
// the reference is the whole op on the sequence's first first + count positions with q, dout and
// the probabilities of the rows before the block zeroed, so that only the block's pairs count.
class AttentionBackwardRows final : public AttentionRowsCase {
 public:
  explicit AttentionBackwardRows(const CaseSpec& c)
      : AttentionRowsCase(c), keys_(2 * s_.B * s_.NKV * s_.T * s_.HS) {}
  void run(Backend& be, Mode mode) override {
    if (dq_.empty()) be.attention_forward_rows(Mode::kCanonical, s_, rows_, out_.data(), att_.data(), qkv_.data());
    dq_.assign(static_cast<size_t>(s_.B * rows_.count * row()), -1.0f);
    scratch_.resize(att_.size());
    std::fill(keys_.f32.begin(), keys_.f32.end(), 0.0f);
    keys_.exact.zero();
    const GradSink sink = keys_.sink(mode);
    be.attention_backward_rows(mode, s_, rows_, dq_.data(), {sink.exact, sink.f32}, scratch_.data(), dout_.data(),
                               qkv_.data(), att_.data());
    mode_ = mode;
  }
  std::vector<Check> checks(Mode mode) const override {
    return backward_checks(mode, computed(), as<Bd>(att_), [&] { return as<Cf>(att_); });
  }

 private:
  // The kernel's q columns of the rows, and dk, dv as (B, T, NKV·HS) (dk scaled after rounding).
  std::vector<std::vector<float>> computed() const {
    const std::vector<float> dq = columns(dq_, s_.B * rows_.count, row(), 0, s_.NH * s_.HS);
    auto [dk, dv] = key_grads(keys_.values(mode_));
    return {dq, dk, dv};
  }
  std::vector<float> dq_, scratch_;
  GradBuffer keys_;
  Mode mode_ = Mode::kCanonical;
};

// The blockwise ops (context parallelism's ring): the rows of AttentionRowsCase against the keys
// [0, first + count), one block (odd seeds) or cut into [64, first + count), which holds the
// diagonal chunk and, where there are any, keys before it, and [0, 64) — passed later block
// first (even seeds); every pass of the
// contract over both, checked against the rows of the whole op's reference (the backward with the
// reference forward's probabilities: the kernel recomputes them from its own statistics).
class AttentionBlocksCase : public AttentionRowsCase {
 public:
  explicit AttentionBlocksCase(const CaseSpec& c) : AttentionRowsCase(c) {
    const int64_t T1 = rows_.first + rows_.count, n = s_.B * s_.NH * rows_.count;
    cuts_ = T1 > kCanonicalChunk && c.seed % 2 == 0
                ? std::vector<QueryRows>{{kCanonicalChunk, T1 - kCanonicalChunk}, {0, kCanonicalChunk}}
                : std::vector<QueryRows>{{0, T1}};
    q_ = rows_of(qkv_, s_.B, s_.T, row());
    const int64_t Q = s_.NH * s_.HS, KV = 2 * s_.NKV * s_.HS;
    for (const QueryRows& k : cuts_) {
      std::vector<float> kv;
      for (int64_t b = 0; b < s_.B; ++b) {
        for (int64_t t = k.first; t < k.first + k.count; ++t) {
          auto from = qkv_.begin() + (b * s_.T + t) * row() + Q;
          kv.insert(kv.end(), from, from + KV);
        }
      }
      kv_.push_back(std::move(kv));
    }
    max_.resize(static_cast<size_t>(n));
    denom_.resize(static_cast<size_t>(n));
    delta_.resize(static_cast<size_t>(n));
    sums_.assign(static_cast<size_t>(n * s_.HS), 0.0f);
    exact_.reset(static_cast<size_t>(n * s_.HS));
  }

 protected:
  BlockSoftmax stats() { return {max_.data(), denom_.data(), delta_.data(), &exact_, sums_.data()}; }
  // Block i: its keys, rows and where its gradients start (blocks back to back).
  KeyBlock block(size_t i) const {
    int64_t at = 0;
    for (size_t k = 0; k < i; ++k) at += 2 * s_.B * s_.NKV * cuts_[k].count * s_.HS;
    return {cuts_[i].first, cuts_[i].count, kv_[i].data(), at};
  }
  // Every forward pass over every block: out_ and the statistics.
  void forward(Backend& be, Mode mode) {
    std::fill(max_.begin(), max_.end(), -INFINITY);
    std::fill(denom_.begin(), denom_.end(), 0.0f);
    const std::vector<BlockPass> passes =
        mode == Mode::kCanonical ? std::vector<BlockPass>{BlockPass::kMax, BlockPass::kSum, BlockPass::kValues}
                                 : std::vector<BlockPass>{BlockPass::kMax, BlockPass::kSum};
    for (BlockPass pass : passes) {
      for (size_t i = 0; i < cuts_.size(); ++i) be.attention_blocks_forward(mode, s_, pass, rows_, block(i), stats(), q_.data());
      if (pass != BlockPass::kMax) be.attention_blocks_end(mode, s_, pass, rows_, stats(), out_.data());
    }
  }
  std::vector<QueryRows> cuts_;
  std::vector<std::vector<float>> kv_;
  std::vector<float> q_, max_, denom_, delta_, sums_;
  ExactAccumulator exact_;
};

class AttentionBlocksForward final : public AttentionBlocksCase {
 public:
  using AttentionBlocksCase::AttentionBlocksCase;
  void run(Backend& be, Mode mode) override { forward(be, mode); }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", out_, ref_forward<Bd>()[0], mode, [&] { return floats(ref_forward<Cf>()[0]); })};
  }
};

// kDelta and kGrads over both blocks after the forward's passes (the end op of each pass is run
// by both cases).
class AttentionBlocksBackward final : public AttentionBlocksCase {
 public:
  explicit AttentionBlocksBackward(const CaseSpec& c)
      : AttentionBlocksCase(c), grads_(2 * s_.B * s_.NKV * (rows_.first + rows_.count) * s_.HS) {}
  void run(Backend& be, Mode mode) override {
    forward(be, mode);
    std::fill(delta_.begin(), delta_.end(), 0.0f);
    std::fill(grads_.f32.begin(), grads_.f32.end(), 0.0f);
    grads_.exact.zero();
    dq_.assign(static_cast<size_t>(s_.B * rows_.count * row()), -1.0f);
    const GradSink sink = grads_.sink(mode);
    for (BlockPass pass : {BlockPass::kDelta, BlockPass::kGrads}) {
      for (size_t i = 0; i < cuts_.size(); ++i) {
        be.attention_blocks_backward(mode, s_, pass, rows_, block(i), stats(), {sink.exact, sink.f32}, dout_.data(), q_.data());
      }
      be.attention_blocks_end(mode, s_, pass, rows_, stats(), dq_.data());
    }
    mode_ = mode;
  }
  std::vector<Check> checks(Mode mode) const override {
    return backward_checks(mode, computed(), ref_forward<Bd>()[1], [&] { return ref_forward<Cf>()[1]; });
  }

 private:
  // dq's q columns, and dk, dv gathered from the blocks' regions into (B, NKV, T, HS).
  std::vector<std::vector<float>> computed() const {
    const std::vector<float> dq = columns(dq_, s_.B * rows_.count, row(), 0, s_.NH * s_.HS);
    const std::vector<float> regions = grads_.values(mode_);
    const int64_t whole = s_.B * s_.NKV * s_.T * s_.HS;
    std::vector<float> sums(static_cast<size_t>(2 * whole), 0.0f);
    for (size_t i = 0; i < cuts_.size(); ++i) {
      const KeyBlock k = block(i);
      for (int64_t part = 0; part < 2; ++part) {
        for (int64_t bg = 0; bg < s_.B * s_.NKV; ++bg) {
          const int64_t from = k.at + (part * s_.B * s_.NKV + bg) * k.count * s_.HS;
          std::copy_n(regions.begin() + from, k.count * s_.HS, sums.begin() + part * whole + (bg * s_.T + k.first) * s_.HS);
        }
      }
    }
    auto [dk, dv] = key_grads(sums);
    return {dq, dk, dv};
  }
  GradBuffer grads_;
  std::vector<float> dq_;
  Mode mode_ = Mode::kCanonical;
};

// ---- rope.hpp

// cos/sin(t·θ^(−2i/HS)) in MPFR against the tables, within rope.hpp's accuracy: one fp32 rounding
// (u·|value|) plus T·2^-49 for the double evaluation of the angle.
class RopeTables final : public OpCase {
 public:
  explicit RopeTables(const CaseSpec& c)
      : T_(dim(c.size, {1, 7, 9, 130, 128, 256})), HS_(dim(c.size, {2, 6, 10, 128, 64, 64})),
        theta_(c.values == ValueClass::kLarge ? 500000.0 : 10000.0) {}
  std::string shape() const override { return dims_text({{"T", T_}, {"HS", HS_}}); }
  void run(Backend& be, Mode) override {
    cos_.assign(static_cast<size_t>(T_ * HS_ / 2), -2.0f);
    sin_ = cos_;
    be.rope_tables(T_, HS_, theta_, cos_.data(), sin_.data());
  }
  std::vector<Check> checks(Mode) const override {
    reference::ScopedMpfrBits bits(128);
    std::vector<Bd> c, s;
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t i = 0; i < HS_ / 2; ++i) {
        const reference::Mpfr angle = reference::Mpfr(t) * pow(reference::Mpfr(theta_), reference::Mpfr(-2 * i) / HS_);
        for (auto [fn, out] : {std::pair{0, &c}, std::pair{1, &s}}) {
          const double v = static_cast<double>(fn == 0 ? reference::Mpfr(cos(angle)) : reference::Mpfr(sin(angle)));
          out->push_back(Bd(v, 0x1p-24 * std::fabs(v) + static_cast<double>(T_) * 0x1p-49 + 0x1p-53 * std::fabs(v)));
        }
      }
    }
    return {{"cos", cos_, c, {}}, {"sin", sin_, s, {}}};
  }

 private:
  int64_t T_, HS_;
  double theta_;
  std::vector<float> cos_, sin_;
};

class RopeCase : public OpCase {
 public:
  RopeCase(const CaseSpec& c, bool backward) : backward_(backward), s_(attention_shape(c.size)) {
    Draw d(c);
    x_ = d.values(s_.B * s_.T * (s_.NH + 2 * s_.NKV) * s_.HS, 60, true);
    s_.HS += s_.HS % 2;  // RoPE rotates pairs
    x_.resize(static_cast<size_t>(s_.B * s_.T * (s_.NH + 2 * s_.NKV) * s_.HS), 0.5f);
    cos_.resize(static_cast<size_t>(s_.T * s_.HS / 2));
    sin_.resize(cos_.size());
    process_backend().rope_tables(s_.T, s_.HS, 10000.0, cos_.data(), sin_.data());
  }
  std::string shape() const override { return attention_text(s_); }
  void run(Backend& be, Mode) override {
    got_ = x_;
    if (backward_) {
      be.rope_backward(s_, got_.data(), cos_.data(), sin_.data());
    } else {
      be.rope_forward(s_, got_.data(), cos_.data(), sin_.data());
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of(backward_ ? "dqkv" : "qkv", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    auto x = as<Real>(x_);
    const auto c = as<Real>(cos_), s = as<Real>(sin_);
    if (backward_) {
      reference::rope_backward(s_.B, s_.T, s_.NH, s_.NKV, s_.HS, x.data(), c.data(), s.data());
    } else {
      reference::rope_forward(s_.B, s_.T, s_.NH, s_.NKV, s_.HS, x.data(), c.data(), s.data());
    }
    return x;
  }
  bool backward_;
  AttentionShape s_;
  std::vector<float> x_, cos_, sin_, got_;
};

// ---- activation.hpp, residual.hpp

// GELU on N·F elements, SwiGLU on (N, 2F) inputs; forward or backward.
class ActivationCase final : public OpCase {
 public:
  ActivationCase(const CaseSpec& c, bool swiglu, bool backward)
      : swiglu_(swiglu), backward_(backward), N_(dim(c.size, {1, 7, 9, 3, 1024, 1024})),
        F_(dim(c.size, {1, 61, 45, 1031, 1024, 2048})) {
    Draw d(c);
    inp_ = d.values(N_ * width(), 40, true);
    if (backward_) dout_ = d.values(N_ * F_);
  }
  std::string shape() const override { return dims_text({{"N", N_}, {"F", F_}}); }
  double bytes() const override { return 4.0 * static_cast<double>(got_.size() + inp_.size() + dout_.size()); }
  void run(Backend& be, Mode mode) override {
    got_.assign(static_cast<size_t>(backward_ ? N_ * width() : N_ * F_), -1.0f);
    if (swiglu_ && backward_) {
      be.swiglu_backward(mode, N_, F_, got_.data(), inp_.data(), dout_.data());
    } else if (swiglu_) {
      be.swiglu_forward(mode, N_, F_, got_.data(), inp_.data());
    } else if (backward_) {
      be.gelu_backward(mode, N_ * F_, got_.data(), inp_.data(), dout_.data());
    } else {
      be.gelu_forward(mode, N_ * F_, got_.data(), inp_.data());
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of(backward_ ? "dinp" : "out", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  int64_t width() const { return swiglu_ ? 2 * F_ : F_; }
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(got_.size());
    const auto i = as<Real>(inp_), o = as<Real>(dout_);
    if (swiglu_ && backward_) {
      reference::swiglu_backward(N_, F_, out.data(), i.data(), o.data());
    } else if (swiglu_) {
      reference::swiglu_forward(N_, F_, out.data(), i.data());
    } else if (backward_) {
      reference::gelu_backward(N_ * F_, out.data(), i.data(), o.data());
    } else {
      reference::gelu_forward(N_ * F_, out.data(), i.data());
    }
    return out;
  }
  bool swiglu_, backward_;
  int64_t N_, F_;
  std::vector<float> inp_, dout_, got_;
};

// ---- cast.hpp

// A rounding to bf16 in place over n values up to fp32's largest (some round to ±inf): the two
// cases differ in the op and its reference, `round(be, out)` and `reference(n, out, inp)`.
template <class Rounding>
class RoundingCase final : public OpCase {
 public:
  RoundingCase(const CaseSpec& c, Rounding r) : n_(dim(c.size, {1, 61, 45, 3093, 256 * 1024, 512 * 1024})), r_(r) {
    Draw d(c);
    inp_ = d.values(n_, 128, true);
  }
  std::string shape() const override { return dims_text({{"n", n_}}); }
  double bytes() const override { return 4.0 * 2 * static_cast<double>(n_); }
  void run(Backend& be, Mode) override {
    got_ = inp_;
    r_.round(be, n_, got_.data());  // in place, as the contracts allow
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    const auto i = as<Real>(inp_);
    std::vector<Real> out(i.size());
    r_.reference(n_, out.data(), i.data());
    return out;
  }
  int64_t n_;
  Rounding r_;
  std::vector<float> inp_, got_;
};

struct NearestBf16 {
  void round(Backend& be, int64_t n, float* x) const { be.round_to_bf16(n, x, x); }
  template <class Real>
  void reference(int64_t n, Real* out, const Real* inp) const {
    reference::round_to_bf16(n, out, inp);
  }
};

// The key and the first global index vary with the seed.
struct StochasticBf16 {
  StochasticKey key;
  int64_t first;
  explicit StochasticBf16(const CaseSpec& c)
      : key{.seed = c.seed, .tensor = static_cast<uint32_t>(c.seed % 7), .step = static_cast<uint32_t>(c.seed % 5 + 1)},
        first(static_cast<int64_t>(c.seed % 13)) {}
  void round(Backend& be, int64_t n, float* x) const { be.round_to_bf16_stochastic(n, key, first, x, x); }
  template <class Real>
  void reference(int64_t n, Real* out, const Real* inp) const {
    reference::round_to_bf16_stochastic(n, key.seed, key.tensor, key.step, first, out, inp);
  }
};

// ---- quantize.hpp

// The seed picks the format, the scaling and its blocks: a per-tensor scale that saturates the
// largest eighth of the range, fp32 scales on 1×128 tiles, power-of-two scales on 32-element rows
// (MXFP8) or columns, fp32 scales on 128×128 blocks.
class QuantizeCase final : public OpCase {
 public:
  explicit QuantizeCase(const CaseSpec& c)
      : rows_(dim(c.size, {1, 7, 33, 130, 1024, 2048})), cols_(dim(c.size, {1, 61, 45, 257, 768, 1024})) {
    Draw d(c);
    inp_ = d.values(rows_ * cols_, 120, true);
    s_.rows = rows_;
    s_.cols = cols_;
    s_.format = c.seed % 2 == 0 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    const uint64_t kind = c.seed / 2 % 5;
    const int64_t blocks[5][2] = {{1, 1}, {1, 128}, {1, 32}, {32, 1}, {128, 128}};
    s_.scaling = kind == 0 ? Fp8Scale::kPerTensor : kind == 1 || kind == 4 ? Fp8Scale::kFp32 : Fp8Scale::kPowerOfTwo;
    s_.block_rows = blocks[kind][0];
    s_.block_cols = blocks[kind][1];
    float amax = 0;
    for (float x : inp_) amax = std::isfinite(x) ? std::max(amax, std::fabs(x)) : amax;
    s_.scale = fp8_scale(amax, s_.format, 0, false, 1.0f) * 1.125f;
  }
  std::string shape() const override {
    return dims_text({{"rows", rows_}, {"cols", cols_}, {"block_rows", s_.block_rows}, {"block_cols", s_.block_cols}}) +
           " " + fp8_format_name(s_.format);
  }
  double bytes() const override { return 4.0 * 2 * static_cast<double>(rows_ * cols_); }
  void run(Backend& be, Mode) override {
    got_.assign(inp_.size(), -1.0f);
    be.quantize_fp8(s_, got_.data(), nullptr, inp_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    const auto i = as<Real>(inp_);
    std::vector<Real> out(i.size());
    const reference::Fp8Quantization q{s_.format, s_.scaling, s_.block_rows, s_.block_cols, s_.scale};
    reference::quantize_fp8(rows_, cols_, q, out.data(), i.data());
    return out;
  }
  int64_t rows_, cols_;
  QuantizeShape s_;
  std::vector<float> inp_, got_;
};

class AbsMax final : public OpCase {
 public:
  explicit AbsMax(const CaseSpec& c) : n_(dim(c.size, {1, 61, 45, 3093, 256 * 1024, 512 * 1024})) {
    Draw d(c);
    inp_ = d.values(n_, 127, true);
  }
  std::string shape() const override { return dims_text({{"n", n_}}); }
  double bytes() const override { return 4.0 * static_cast<double>(n_); }
  void run(Backend& be, Mode) override { be.abs_max(n_, &got_, inp_.data()); }
  std::vector<Check> checks(Mode mode) const override {
    float want = 0;
    bool nan = false;
    for (float x : inp_) {
      nan = nan || std::isnan(x);
      want = std::max(want, std::fabs(x));
    }
    if (nan) want = NAN;
    return {check_of("result", {got_}, {Bd(static_cast<double>(want))}, mode, [&] { return std::vector<float>{want}; })};
  }

 private:
  int64_t n_;
  float got_ = -1;
  std::vector<float> inp_;
};

class ResidualForward final : public OpCase {
 public:
  explicit ResidualForward(const CaseSpec& c) : n_(dim(c.size, {1, 61, 45, 3093, 256 * 1024, 512 * 1024})) {
    Draw d(c);
    a_ = d.values(n_, 127, true);
    b_ = d.values(n_, 127);
  }
  std::string shape() const override { return dims_text({{"n", n_}}); }
  double bytes() const override { return 4.0 * 3 * static_cast<double>(n_); }
  void run(Backend& be, Mode) override {
    out_.assign(static_cast<size_t>(n_), -1.0f);
    be.residual_forward(n_, out_.data(), a_.data(), b_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", out_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(out_.size());
    const auto a = as<Real>(a_), b = as<Real>(b_);
    reference::residual_forward(n_, out.data(), a.data(), b.data());
    return out;
  }
  int64_t n_;
  std::vector<float> a_, b_, out_;
};

// ---- embedding.hpp (with learned positions)

class EmbeddingCase : public OpCase {
 public:
  explicit EmbeddingCase(const CaseSpec& c)
      : s_{dim(c.size, {1, 2, 3, 2, 8, 4}), dim(c.size, {1, 7, 9, 130, 128, 256}), dim(c.size, {1, 13, 15, 8, 256, 512}),
           dim(c.size, {2, 11, 21, 37, 4096, 8192})},
        dwte_(s_.V * s_.C), dwpe_(s_.T * s_.C) {
    Draw d(c);
    tokens_ = d.ints(s_.B * s_.T, static_cast<int32_t>(s_.V));
    wte_ = d.values(s_.V * s_.C, 126, true);
    wpe_ = d.values(s_.T * s_.C, 126);
    dout_ = d.values(s_.B * s_.T * s_.C, 100, true);
  }
  std::string shape() const override {
    return dims_text({{"B", s_.B}, {"T", s_.T}, {"C", s_.C}, {"V", s_.V}});
  }
  double bytes() const override { return 4.0 * 2 * static_cast<double>(s_.B * s_.T * s_.C); }

 protected:
  EmbeddingShape s_;
  std::vector<int32_t> tokens_;
  std::vector<float> wte_, wpe_, dout_, out_;
  GradBuffer dwte_, dwpe_;
  Mode mode_ = Mode::kCanonical;
};

class EmbeddingForward final : public EmbeddingCase {
 public:
  using EmbeddingCase::EmbeddingCase;
  void run(Backend& be, Mode mode) override {
    out_.assign(static_cast<size_t>(s_.B * s_.T * s_.C), -1.0f);
    be.embedding_forward(mode, s_, out_.data(), tokens_.data(), wte_.data(), wpe_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("out", out_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(out_.size());
    const auto e = as<Real>(wte_), p = as<Real>(wpe_);
    reference::embedding_forward(s_.B, s_.T, s_.C, s_.V, out.data(), tokens_.data(), e.data(), p.data());
    return out;
  }
};

class EmbeddingBackward final : public EmbeddingCase {
 public:
  using EmbeddingCase::EmbeddingCase;
  void run(Backend& be, Mode mode) override {
    mode_ = mode;
    be.embedding_backward(mode, s_, 0, dwte_.sink(mode), dwpe_.sink(mode), dout_.data(), tokens_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref<Bd>();
    return {check_of("dwte", dwte_.values(mode_), b[0], mode, [&] { return floats(ref<Cf>()[0]); }),
            check_of("dwpe", dwpe_.values(mode_), b[1], mode, [&] { return floats(ref<Cf>()[1]); })};
  }

 private:
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    GradStore<Real> dwte, dwpe;
    dwte.reset(s_.V * s_.C);
    dwpe.reset(s_.T * s_.C);
    const auto o = as<Real>(dout_);
    reference::embedding_backward(s_.B, s_.T, s_.C, s_.V, dwte.out(0), dwpe.out(0), o.data(), tokens_.data());
    dwte.finish();
    dwpe.finish();
    return {dwte.g, dwpe.g};
  }
};

// ---- crossentropy.hpp

class CrossEntropyCase : public OpCase {
 public:
  explicit CrossEntropyCase(const CaseSpec& c)
      : N_(dim(c.size, {1, 7, 9, 3, 1024, 1024})), V_(dim(c.size, {1, 61, 131, 4099, 4096, 8192})) {
    Draw d(c);
    logits_ = d.values(N_ * V_, 20, true);
    targets_ = d.ints(N_, static_cast<int32_t>(V_));
  }
  std::string shape() const override { return dims_text({{"N", N_}, {"V", V_}}); }
  double bytes() const override { return 4.0 * 2 * static_cast<double>(N_ * V_); }

 protected:
  // losses and, with backward, dlogits (dloss 1/N).
  template <class Real>
  std::vector<std::vector<Real>> ref(bool backward) const {
    std::vector<Real> losses(static_cast<size_t>(N_));
    auto x = as<Real>(logits_);
    if (backward) {
      reference::crossentropy_forward_backward(N_, V_, Real(dloss()), losses.data(), x.data(), targets_.data());
    } else {
      reference::crossentropy_forward(N_, V_, losses.data(), x.data(), targets_.data());
    }
    return {losses, x};
  }
  float dloss() const { return 1.0f / static_cast<float>(N_); }
  int64_t N_, V_;
  std::vector<float> logits_, losses_, got_logits_;
  std::vector<int32_t> targets_;
};

class CrossEntropyForward final : public CrossEntropyCase {
 public:
  CrossEntropyForward(const CaseSpec& c, bool backward) : CrossEntropyCase(c), backward_(backward) {}
  void run(Backend& be, Mode mode) override {
    losses_.assign(static_cast<size_t>(N_), -1.0f);
    got_logits_ = logits_;
    if (backward_) {
      be.crossentropy_forward_backward(mode, {N_, V_}, dloss(), losses_.data(), got_logits_.data(), targets_.data());
    } else {
      be.crossentropy_forward(mode, {N_, V_}, losses_.data(), got_logits_.data(), targets_.data());
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref<Bd>(backward_);
    std::vector<Check> out{check_of("losses", losses_, b[0], mode, [&] { return floats(ref<Cf>(backward_)[0]); })};
    if (backward_) {
      out.push_back(check_of("dlogits", got_logits_, b[1], mode, [&] { return floats(ref<Cf>(backward_)[1]); }));
    }
    return out;
  }

 private:
  bool backward_;
};

// The row maxima of a vocabulary shard: exact in any order, so equal to the contract's loop over
// the shard's columns in both modes.
class CrossEntropyShardMax final : public CrossEntropyCase {
 public:
  using CrossEntropyCase::CrossEntropyCase;
  void run(Backend& be, Mode) override {
    const int64_t cut = chunk_cut(V_);
    shard_ = columns(logits_, N_, V_, cut == V_ ? 0 : cut, V_);
    const int64_t held = V_ - (cut == V_ ? 0 : cut);
    m_.assign(static_cast<size_t>(N_), -1.0f);
    be.crossentropy_shard_max({N_, held, V_ - held, V_}, m_.data(), shard_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    const int64_t held = static_cast<int64_t>(shard_.size()) / std::max<int64_t>(N_, 1);
    std::vector<float> want;
    std::vector<Bd> bounded;
    for (int64_t n = 0; n < N_; ++n) {
      // The contract's loop (crossentropy.hpp): from -inf, x > m wins, NaN skipped.
      const float* x = shard_.data() + n * held;
      float m = -INFINITY;
      for (int64_t v = 0; v < held; ++v) m = x[v] > m ? x[v] : m;
      want.push_back(m);
      bounded.emplace_back(Bd(m));
    }
    return {check_of("m", m_, bounded, mode, [&] { return want; })};
  }

 private:
  std::vector<float> shard_, m_;
};

// The three vocabulary-parallel pieces over two chunk-aligned shards, combined as a tensor-parallel
// plan combines them (max, exact sum of the denominators' partials, the owner's target logit): the
// unsplit cross-entropy's losses and dlogits. Registered for crossentropy_shard_partition and
// crossentropy_shard_finish, which only work together.
class CrossEntropyShards final : public CrossEntropyCase {
 public:
  using CrossEntropyCase::CrossEntropyCase;
  void run(Backend& be, Mode mode) override {
    const int64_t cut = chunk_cut(V_);
    const std::pair<int64_t, int64_t> shards[] = {{0, cut}, {cut, V_}};
    std::vector<float> m(static_cast<size_t>(N_), -INFINITY), part(m.size()), target(m.size(), -0.0f);
    std::vector<std::vector<float>> logits;
    for (const auto& [v0, v1] : shards) {
      logits.push_back(columns(logits_, N_, V_, v0, v1));
      if (v1 == v0) continue;
      be.crossentropy_shard_max({N_, v1 - v0, v0, V_}, part.data(), logits.back().data());
      for (size_t n = 0; n < m.size(); ++n) m[n] = std::isnan(part[n]) || std::isnan(m[n]) ? NAN : std::max(m[n], part[n]);
    }
    ExactAccumulator Z(static_cast<size_t>(N_));
    for (size_t k = 0; k < 2; ++k) {
      const auto [v0, v1] = shards[k];
      if (v1 == v0) continue;
      be.crossentropy_shard_partition(mode, {N_, v1 - v0, v0, V_}, Z, part.data(), logits[k].data(), m.data(),
                                      targets_.data());
      for (size_t n = 0; n < target.size(); ++n) target[n] = target[n] + part[n];
    }
    std::vector<float> z(m.size());
    Z.round_to(z.data());
    losses_.assign(m.size(), -1.0f);
    got_logits_.assign(logits_.size(), -1.0f);
    for (size_t k = 0; k < 2; ++k) {
      const auto [v0, v1] = shards[k];
      if (v1 == v0) continue;
      std::vector<float> d(logits[k].size());
      be.crossentropy_shard_finish(mode, {N_, v1 - v0, v0, V_}, dloss(), losses_.data(), d.data(), logits[k].data(),
                                   m.data(), z.data(), target.data(), targets_.data());
      for (int64_t n = 0; n < N_; ++n) {
        std::copy(d.begin() + n * (v1 - v0), d.begin() + (n + 1) * (v1 - v0), got_logits_.begin() + n * V_ + v0);
      }
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref<Bd>(true);
    return {check_of("losses", losses_, b[0], mode, [&] { return floats(ref<Cf>(true)[0]); }),
            check_of("dlogits", got_logits_, b[1], mode, [&] { return floats(ref<Cf>(true)[1]); })};
  }
};

// ---- optim.hpp

class OptimCase : public OpCase {
 public:
  explicit OptimCase(const CaseSpec& c) : n_(dim(c.size, {1, 61, 45, 3093, 4227072, 23199744})) {
    Draw d(c);
    g_ = d.values(n_, 60, true);
    p_ = d.values(n_);
    m_ = d.values(n_);
    v_ = d.positive(n_);
  }
  std::string shape() const override { return dims_text({{"n", n_}}); }

 protected:
  int64_t n_;
  std::vector<float> g_, p_, m_, v_;
};

class AdamWUpdate final : public OptimCase {
 public:
  using OptimCase::OptimCase;
  double bytes() const override { return 4.0 * 7 * static_cast<double>(n_); }  // p, m, v read and written, g read
  void run(Backend& be, Mode) override {
    gp_ = p_, gm_ = m_, gv_ = v_;
    be.adamw_update(n_, {kH.lr, kH.beta1, kH.beta2, kH.eps, kH.weight_decay, kH.bc1, kH.bc2}, gp_.data(), gm_.data(),
                    gv_.data(), g_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    const auto b = ref<Bd>();
    const char* names[] = {"param", "m", "v"};
    const std::vector<float>* got[] = {&gp_, &gm_, &gv_};
    std::vector<Check> out;
    for (size_t k = 0; k < 3; ++k) {
      out.push_back(check_of(names[k], *got[k], b[k], mode, [&] { return floats(ref<Cf>()[k]); }));
    }
    return out;
  }

 private:
  static constexpr reference::AdamWParams kH{0x1p-10f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.0975f};
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    auto p = as<Real>(p_), m = as<Real>(m_), v = as<Real>(v_);
    const auto g = as<Real>(g_);
    reference::adamw_update(n_, kH, p.data(), m.data(), v.data(), g.data());
    return {p, m, v};
  }
  std::vector<float> gp_, gm_, gv_;
};

class GradSumsq final : public OptimCase {
 public:
  using OptimCase::OptimCase;
  double bytes() const override { return 4.0 * static_cast<double>(n_); }
  void run(Backend& be, Mode mode) override {
    ChunkCombiner acc;
    be.grad_sumsq_accumulate(mode, n_, acc, g_.data());
    got_ = {acc.finish()};
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("sumsq", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    Real acc = Real(0);
    const auto g = as<Real>(g_);
    reference::grad_sumsq_accumulate(n_, acc, g.data());
    return {acc};
  }
  std::vector<float> got_;
};

class ScaleInplace final : public OptimCase {
 public:
  using OptimCase::OptimCase;
  double bytes() const override { return 4.0 * 2 * static_cast<double>(n_); }
  void run(Backend& be, Mode) override {
    got_ = g_;
    be.scale_inplace(n_, got_.data(), kScale);
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("g", got_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  static constexpr float kScale = 0.3f;
  template <class Real>
  std::vector<Real> ref() const {
    auto g = as<Real>(g_);
    reference::scale_inplace(n_, g.data(), kScale);
    return g;
  }
  std::vector<float> got_;
};

// ---- moe.hpp (its own file: it relies on the helpers above)

}  // namespace lockstep::test
#include "tests/support/op_cases_moe.hpp"
namespace lockstep::test {

// ---- the registry: one maker per line of ops.def.

inline std::unique_ptr<OpCase> make_linear_forward(const CaseSpec& c) { return std::make_unique<LinearForward>(c); }
inline std::unique_ptr<OpCase> make_linear_backward(const CaseSpec& c) { return std::make_unique<LinearBackward>(c); }
inline std::unique_ptr<OpCase> make_linear_forward_partials(const CaseSpec& c) {
  return std::make_unique<LinearPartials>(c, false);
}
inline std::unique_ptr<OpCase> make_linear_backward_dinp_partials(const CaseSpec& c) {
  return std::make_unique<LinearPartials>(c, true);
}
inline std::unique_ptr<OpCase> make_layernorm_forward(const CaseSpec& c) { return std::make_unique<NormForward>(c, true); }
inline std::unique_ptr<OpCase> make_layernorm_backward(const CaseSpec& c) {
  return std::make_unique<NormBackward>(c, true);
}
inline std::unique_ptr<OpCase> make_rmsnorm_forward(const CaseSpec& c) { return std::make_unique<NormForward>(c, false); }
inline std::unique_ptr<OpCase> make_rmsnorm_backward(const CaseSpec& c) { return std::make_unique<NormBackward>(c, false); }
inline std::unique_ptr<OpCase> make_attention_forward(const CaseSpec& c) { return std::make_unique<AttentionForward>(c); }
inline std::unique_ptr<OpCase> make_attention_backward(const CaseSpec& c) { return std::make_unique<AttentionBackward>(c); }
inline std::unique_ptr<OpCase> make_attention_forward_rows(const CaseSpec& c) {
  return std::make_unique<AttentionForwardRows>(c);
}
inline std::unique_ptr<OpCase> make_attention_backward_rows(const CaseSpec& c) {
  return std::make_unique<AttentionBackwardRows>(c);
}
inline std::unique_ptr<OpCase> make_attention_blocks_forward(const CaseSpec& c) {
  return std::make_unique<AttentionBlocksForward>(c);
}
inline std::unique_ptr<OpCase> make_attention_blocks_backward(const CaseSpec& c) {
  return std::make_unique<AttentionBlocksBackward>(c);
}
// The end op runs inside both blockwise cases; its own case is the backward's, which ends every pass.
inline std::unique_ptr<OpCase> make_attention_blocks_end(const CaseSpec& c) {
  return std::make_unique<AttentionBlocksBackward>(c);
}
inline std::unique_ptr<OpCase> make_rope_tables(const CaseSpec& c) { return std::make_unique<RopeTables>(c); }
inline std::unique_ptr<OpCase> make_rope_forward(const CaseSpec& c) { return std::make_unique<RopeCase>(c, false); }
inline std::unique_ptr<OpCase> make_rope_backward(const CaseSpec& c) { return std::make_unique<RopeCase>(c, true); }
inline std::unique_ptr<OpCase> make_gelu_forward(const CaseSpec& c) { return std::make_unique<ActivationCase>(c, false, false); }
inline std::unique_ptr<OpCase> make_gelu_backward(const CaseSpec& c) { return std::make_unique<ActivationCase>(c, false, true); }
inline std::unique_ptr<OpCase> make_swiglu_forward(const CaseSpec& c) { return std::make_unique<ActivationCase>(c, true, false); }
inline std::unique_ptr<OpCase> make_swiglu_backward(const CaseSpec& c) { return std::make_unique<ActivationCase>(c, true, true); }
inline std::unique_ptr<OpCase> make_round_to_bf16(const CaseSpec& c) {
  return std::make_unique<RoundingCase<NearestBf16>>(c, NearestBf16{});
}
inline std::unique_ptr<OpCase> make_round_to_bf16_stochastic(const CaseSpec& c) {
  return std::make_unique<RoundingCase<StochasticBf16>>(c, StochasticBf16(c));
}
inline std::unique_ptr<OpCase> make_quantize_fp8(const CaseSpec& c) { return std::make_unique<QuantizeCase>(c); }
inline std::unique_ptr<OpCase> make_abs_max(const CaseSpec& c) { return std::make_unique<AbsMax>(c); }
inline std::unique_ptr<OpCase> make_residual_forward(const CaseSpec& c) { return std::make_unique<ResidualForward>(c); }
inline std::unique_ptr<OpCase> make_embedding_forward(const CaseSpec& c) { return std::make_unique<EmbeddingForward>(c); }
inline std::unique_ptr<OpCase> make_embedding_backward(const CaseSpec& c) { return std::make_unique<EmbeddingBackward>(c); }
inline std::unique_ptr<OpCase> make_crossentropy_forward_backward(const CaseSpec& c) {
  return std::make_unique<CrossEntropyForward>(c, true);
}
inline std::unique_ptr<OpCase> make_crossentropy_forward(const CaseSpec& c) {
  return std::make_unique<CrossEntropyForward>(c, false);
}
inline std::unique_ptr<OpCase> make_crossentropy_shard_max(const CaseSpec& c) {
  return std::make_unique<CrossEntropyShardMax>(c);
}
inline std::unique_ptr<OpCase> make_crossentropy_shard_partition(const CaseSpec& c) {
  return std::make_unique<CrossEntropyShards>(c);
}
inline std::unique_ptr<OpCase> make_crossentropy_shard_finish(const CaseSpec& c) {
  return std::make_unique<CrossEntropyShards>(c);
}
inline std::unique_ptr<OpCase> make_adamw_update(const CaseSpec& c) { return std::make_unique<AdamWUpdate>(c); }
inline std::unique_ptr<OpCase> make_grad_sumsq_accumulate(const CaseSpec& c) { return std::make_unique<GradSumsq>(c); }
inline std::unique_ptr<OpCase> make_scale_inplace(const CaseSpec& c) { return std::make_unique<ScaleInplace>(c); }

struct OpEntry {
  std::string_view name;
  std::unique_ptr<OpCase> (*make)(const CaseSpec&);
};

// Every op of ops.def with its case maker, in ops.def's order.
inline const std::vector<OpEntry>& op_entries() {
  static const std::vector<OpEntry> kEntries = {
#define LS_OP(name, params, args) {#name, &make_##name},
#include "kernels/ops/ops.def"
#undef LS_OP
  };
  return kEntries;
}

}  // namespace lockstep::test
