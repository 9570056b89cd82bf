// The op test driver's cases of kernels/ops/moe.hpp (op_cases.hpp's conventions): the router's
// cached inputs (probabilities, choices, gates) are the backend's own forward outputs, and the
// router's choice is checked as an integer output against reference::top_k of its probabilities.
// Rows of the experts' buffer come from a random routing with about one choice in eight dropped.
// Included by op_cases.hpp, after the helpers it uses (dim, check_of).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "reference/moe.hpp"
#include "tests/support/op_case.hpp"

namespace lockstep::test {

// A router shape per size class and seed: the score alternates softmax / sigmoid, normalisation
// every other pair of seeds, and groups of one token or of the whole batch (or a few sequences).
inline RouterShape router_shape(const CaseSpec& c) {
  RouterShape s{dim(c.size, {1, 7, 9, 130, 1024, 1024}), dim(c.size, {1, 5, 8, 67, 8, 64}), 1};
  s.K = std::min(s.E, dim(c.size, {1, 2, 3, 4, 2, 8}));
  s.score = c.seed % 2 == 0 ? RouterScore::kSoftmax : RouterScore::kSigmoid;
  s.normalize = c.seed % 4 < 2;
  s.group = c.seed % 3 == 0 ? 1 : dim(c.size, {1, 7, 3, 130, 512, 256});
  return s;
}
inline reference::RouterDims router_dims(const RouterShape& s) {
  return {s.N, s.E, s.K, s.score == RouterScore::kSoftmax, s.normalize, s.group};
}
inline std::string router_text(const RouterShape& s) {
  return dims_text({{"N", s.N}, {"E", s.E}, {"K", s.K}, {"group", s.group}}) +
         (s.score == RouterScore::kSoftmax ? " softmax" : " sigmoid") + (s.normalize ? " normalized" : "");
}

// The router forward of `be` on logits: probabilities, choices and gates.
struct RouterOutputs {
  std::vector<float> probs, gates;
  std::vector<int32_t> experts;
  // With a bias of E values, the choice is by probs + bias.
  void run(Backend& be, const RouterShape& s, const std::vector<float>& logits, const std::vector<float>& bias = {}) {
    probs.assign(static_cast<size_t>(s.N * s.E), -1.0f);
    gates.assign(static_cast<size_t>(s.N * s.K), -1.0f);
    experts.assign(static_cast<size_t>(s.N * s.K), -1);
    be.router_forward(s, probs.data(), experts.data(), gates.data(), logits.data(), bias.empty() ? nullptr : bias.data());
  }
};

// Every other four seeds with a selection bias (values of the probabilities' size).
class RouterForward final : public OpCase {
 public:
  explicit RouterForward(const CaseSpec& c) : s_(router_shape(c)) {
    Draw d(c);
    logits_ = d.values(s_.N * s_.E, 6, true);
    if (c.seed / 4 % 2 == 1) {
      for (float x : d.values(s_.E)) bias_.push_back(x / 16);
    }
  }
  std::string shape() const override { return router_text(s_) + (bias_.empty() ? "" : " biased"); }
  void run(Backend& be, Mode) override { out_.run(be, s_, logits_, bias_); }
  std::vector<Check> checks(Mode mode) const override {
    std::vector<float> chosen, want;
    for (int64_t n = 0; n < s_.N; ++n) {
      std::vector<float> score(out_.probs.begin() + n * s_.E, out_.probs.begin() + (n + 1) * s_.E);
      for (size_t e = 0; e < bias_.size(); ++e) score[e] = score[e] + bias_[e];
      for (int32_t e : reference::top_k(score.data(), s_.E, s_.K)) want.push_back(static_cast<float>(e));
    }
    for (int32_t e : out_.experts) chosen.push_back(static_cast<float>(e));
    return {check_of("probs", out_.probs, ref<Bd>()[0], mode, [&] { return floats(ref<Cf>()[0]); }),
            check_of("gates", out_.gates, ref<Bd>()[1], mode, [&] { return floats(ref<Cf>()[1]); }),
            check_of("experts", chosen, as<Bd>(want), mode, [&] { return want; })};
  }

 private:
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    std::vector<Real> probs(out_.probs.size()), gates(out_.gates.size());
    const auto x = as<Real>(logits_);
    reference::router_forward(router_dims(s_), probs.data(), gates.data(), x.data(), out_.experts.data());
    return {probs, gates};
  }
  RouterShape s_;
  std::vector<float> logits_, bias_;
  RouterOutputs out_;
};

class RouterBackward final : public OpCase {
 public:
  explicit RouterBackward(const CaseSpec& c) : s_(router_shape(c)) {
    Draw d(c);
    logits_ = d.values(s_.N * s_.E);
    dgates_ = d.values(s_.N * s_.K, 100, true);
    daux_ = d.values(s_.N / s_.group * s_.E, 100);
  }
  std::string shape() const override { return router_text(s_); }
  void run(Backend& be, Mode) override {
    fwd_.run(be, s_, logits_);
    dlogits_.assign(static_cast<size_t>(s_.N * s_.E), -1.0f);
    be.router_backward(s_, dlogits_.data(), fwd_.probs.data(), fwd_.experts.data(), fwd_.gates.data(), dgates_.data(),
                       daux_.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("dlogits", dlogits_, ref<Bd>(), mode, [&] { return floats(ref<Cf>()); })};
  }

 private:
  template <class Real>
  std::vector<Real> ref() const {
    std::vector<Real> out(dlogits_.size());
    const auto p = as<Real>(fwd_.probs), g = as<Real>(fwd_.gates), dg = as<Real>(dgates_), a = as<Real>(daux_);
    reference::router_backward(router_dims(s_), out.data(), p.data(), fwd_.experts.data(), g.data(), dg.data(), a.data());
    return out;
  }
  RouterShape s_;
  std::vector<float> logits_, dgates_, daux_, dlogits_;
  RouterOutputs fwd_;
};

class AuxLoss final : public OpCase {
 public:
  explicit AuxLoss(const CaseSpec& c) : s_(router_shape(c)) { logits_ = Draw(c).values(s_.N * s_.E, 0, true); }
  std::string shape() const override { return router_text(s_); }
  void run(Backend& be, Mode) override {
    fwd_.run(be, s_, logits_);
    loss_.assign(static_cast<size_t>(s_.N / s_.group), -1.0f);
    daux_.assign(static_cast<size_t>(s_.N / s_.group * s_.E), -1.0f);
    mean_.assign(daux_.size(), -1.0f);
    be.moe_aux_loss(s_, kWeight, dloss(), loss_.data(), daux_.data(), mean_.data(), fwd_.probs.data(),
                    fwd_.experts.data());
  }
  std::vector<Check> checks(Mode mode) const override {
    return {check_of("loss", loss_, ref<Bd>()[0], mode, [&] { return floats(ref<Cf>()[0]); }),
            check_of("daux", daux_, ref<Bd>()[1], mode, [&] { return floats(ref<Cf>()[1]); }),
            check_of("mean_probs", mean_, ref<Bd>()[2], mode, [&] { return floats(ref<Cf>()[2]); })};
  }

 private:
  static constexpr float kWeight = 0.01f;
  float dloss() const { return 1.0f / static_cast<float>(s_.N); }
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    std::vector<Real> loss(loss_.size()), daux(daux_.size()), mean(mean_.size());
    const auto p = as<Real>(fwd_.probs);
    reference::moe_aux_loss(router_dims(s_), kWeight, dloss(), loss.data(), daux.data(), mean.data(), p.data(),
                            fwd_.experts.data());
    return {loss, daux, mean};
  }
  RouterShape s_;
  std::vector<float> logits_, loss_, daux_, mean_;
  RouterOutputs fwd_;
};

// The rows of a random routing: rows (N, K) expert-major in token order, −1 for a dropped choice,
// and the token of each row.
struct RandomRows {
  MoeRowsShape s;
  std::vector<int32_t> rows, token_of_row;
  RandomRows(const CaseSpec& c, Draw& d) {
    s = {dim(c.size, {1, 7, 9, 130, 1024, 1024}), 0, dim(c.size, {1, 13, 33, 1031, 256, 512}),
         dim(c.size, {1, 2, 3, 4, 2, 8})};
    const int64_t E = 4;
    std::vector<int32_t> expert(static_cast<size_t>(s.N * s.K));
    for (auto& e : expert) e = d.below(8) == 0 ? -1 : static_cast<int32_t>(d.below(E));
    rows.assign(expert.size(), -1);
    for (int32_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < s.N * s.K; ++i) {
        if (expert[static_cast<size_t>(i)] != e) continue;
        rows[static_cast<size_t>(i)] = static_cast<int32_t>(token_of_row.size());
        token_of_row.push_back(static_cast<int32_t>(i / s.K));
      }
    }
    s.R = static_cast<int64_t>(token_of_row.size());
  }
  std::string text() const { return dims_text({{"N", s.N}, {"R", s.R}, {"C", s.C}, {"K", s.K}}); }
};

// dispatch (a copy), its backward and the combine's two directions.
class MoeRowsCase final : public OpCase {
 public:
  enum class Op { kDispatch, kDispatchBackward, kCombine, kCombineBackward };
  MoeRowsCase(const CaseSpec& c, Op op) : op_(op), d_(c), r_(c, d_) {
    const int64_t N = r_.s.N, R = r_.s.R, C = r_.s.C, K = r_.s.K;
    tokens_ = d_.values(N * C, 100, true);  // inp, dinp's start, dout of the combine
    // y, dout of the dispatch; ordinary in the combine's backward, whose dgates multiply it by dout
    rows_ = d_.values(R * C, op == Op::kCombineBackward ? 0 : 100, true);
    gates_ = d_.values(N * K);
  }
  std::string shape() const override { return r_.text(); }
  void run(Backend& be, Mode) override {
    const MoeRowsShape& s = r_.s;
    a_.assign(static_cast<size_t>(op_ == Op::kDispatch || op_ == Op::kCombineBackward ? s.R * s.C : s.N * s.C), -1.0f);
    b_.assign(static_cast<size_t>(s.N * s.K), -1.0f);
    switch (op_) {
      case Op::kDispatch: be.moe_dispatch(s, a_.data(), tokens_.data(), r_.token_of_row.data()); break;
      case Op::kDispatchBackward:
        a_ = tokens_;
        be.moe_dispatch_backward(s, a_.data(), rows_.data(), r_.rows.data());
        break;
      case Op::kCombine: be.moe_combine_forward(s, a_.data(), rows_.data(), r_.rows.data(), gates_.data()); break;
      case Op::kCombineBackward:
        be.moe_combine_backward(s, a_.data(), b_.data(), tokens_.data(), rows_.data(), r_.rows.data(), gates_.data());
        break;
    }
  }
  std::vector<Check> checks(Mode mode) const override {
    std::vector<Check> out{check_of("out", a_, ref<Bd>()[0], mode, [&] { return floats(ref<Cf>()[0]); })};
    if (op_ == Op::kCombineBackward) {
      out.push_back(check_of("dgates", b_, ref<Bd>()[1], mode, [&] { return floats(ref<Cf>()[1]); }));
    }
    return out;
  }

 private:
  template <class Real>
  std::vector<std::vector<Real>> ref() const {
    const MoeRowsShape& s = r_.s;
    const auto tokens = as<Real>(tokens_), rows = as<Real>(rows_), gates = as<Real>(gates_);
    std::vector<Real> a(a_.size()), b(b_.size());
    switch (op_) {
      case Op::kDispatch:
        for (int64_t r = 0; r < s.R; ++r)
          for (int64_t c = 0; c < s.C; ++c) a[r * s.C + c] = tokens[r_.token_of_row[r] * s.C + c];
        break;
      case Op::kDispatchBackward:
        a = tokens;
        reference::moe_dispatch_backward(s.N, s.C, s.K, a.data(), rows.data(), r_.rows.data());
        break;
      case Op::kCombine: reference::moe_combine_forward(s.N, s.C, s.K, a.data(), rows.data(), r_.rows.data(), gates.data()); break;
      case Op::kCombineBackward:
        // Rows no choice points at are not written: the kernel's −1 stays.
        for (size_t i = 0; i < a.size(); ++i) a[i] = Real(-1.0f);
        reference::moe_combine_backward(s.N, s.C, s.K, a.data(), b.data(), tokens.data(), rows.data(), r_.rows.data(), gates.data());
        break;
    }
    return {a, b};
  }
  Op op_;
  Draw d_;
  RandomRows r_;
  std::vector<float> tokens_, rows_, gates_, a_, b_;
};

inline std::unique_ptr<OpCase> make_router_forward(const CaseSpec& c) { return std::make_unique<RouterForward>(c); }
inline std::unique_ptr<OpCase> make_router_backward(const CaseSpec& c) { return std::make_unique<RouterBackward>(c); }
inline std::unique_ptr<OpCase> make_moe_aux_loss(const CaseSpec& c) { return std::make_unique<AuxLoss>(c); }
inline std::unique_ptr<OpCase> make_moe_dispatch(const CaseSpec& c) {
  return std::make_unique<MoeRowsCase>(c, MoeRowsCase::Op::kDispatch);
}
inline std::unique_ptr<OpCase> make_moe_dispatch_backward(const CaseSpec& c) {
  return std::make_unique<MoeRowsCase>(c, MoeRowsCase::Op::kDispatchBackward);
}
inline std::unique_ptr<OpCase> make_moe_combine_forward(const CaseSpec& c) {
  return std::make_unique<MoeRowsCase>(c, MoeRowsCase::Op::kCombine);
}
inline std::unique_ptr<OpCase> make_moe_combine_backward(const CaseSpec& c) {
  return std::make_unique<MoeRowsCase>(c, MoeRowsCase::Op::kCombineBackward);
}

}  // namespace lockstep::test
