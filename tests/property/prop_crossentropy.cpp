// Properties of the fused softmax cross-entropy (losses and dlogits) and its forward-only form,
// both modes: within the Bounded<double> reference's bound (reference/crossentropy.hpp: order-free
// sum of the exps, the kernels' documented exp/log accuracy), canonical mode bitwise equal to
// spec.hpp, NaN/Inf propagation as in the reference.
//
// Rows carry a random offset of up to ±1000, so exp without the max subtraction overflows.
// No magnitudes near overflow: there x − m carries an error bound of u·2^127, and Bounded exp's
// e^v·expm1(E) is 0·inf = NaN for every far-below-max logit: a vacuous check.
#include <string>
#include <vector>

#include "kernels/ops/crossentropy.hpp"
#include "reference/crossentropy.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {

std::vector<float> gen_logits(int64_t N, int64_t V) {
  auto x = gen_values(N * V, ValueKinds{4, true, true, 0});
  for (int64_t n = 0; n < N; ++n) {
    const auto offset = static_cast<float>(*rc::gen::inRange<int32_t>(-1000, 1001));
    for (int64_t v = 0; v < V; ++v) x[n * V + v] = x[n * V + v] + offset;
  }
  return x;
}

RC_GTEST_PROP(CrossEntropyProperty, WithinBoundAndCanonicalBitwise, ()) {
  const int64_t N = gen_dim(7);
  const int64_t V = *rc::gen::weightedOneOf<int64_t>(
      {{3, rc::gen::inRange<int64_t>(1, 300)}, {1, rc::gen::element<int64_t>(1, 2, 63, 64, 65, 257)}});
  const std::string where = shape_str({{"N", N}, {"V", V}});
  const auto logits = gen_logits(N, V);
  const auto targets = *rc::gen::container<std::vector<int32_t>>(
      static_cast<size_t>(N), rc::gen::inRange<int32_t>(0, static_cast<int32_t>(V)));
  const float dloss = *gen_value(ValueKinds{3, true, false, 0});

  auto blog = bounded<double>(logits);
  std::vector<BD> rloss(N), rloss_fwd(N);
  reference::crossentropy_forward(N, V, rloss_fwd.data(), blog.data(), targets.data());
  reference::crossentropy_forward_backward(N, V, BD(static_cast<double>(dloss)), rloss.data(),
                                           blog.data(), targets.data());
  std::vector<float> sloss(N), sd(N * V);
  spec::crossentropy(N, V, dloss, sloss.data(), sd.data(), logits.data(), targets.data());

  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    std::vector<float> loss(N), loss_fwd(N), d = logits;
    cpu::crossentropy_forward(mode, {N, V}, loss_fwd.data(), logits.data(), targets.data());
    cpu::crossentropy_forward_backward(mode, {N, V}, dloss, loss.data(), d.data(), targets.data());
    check_within("crossentropy_forward loss " + m, where, loss_fwd, rloss_fwd);
    check_within("crossentropy_forward_backward loss " + m, where, loss, rloss);
    check_within("crossentropy_forward_backward dlogits " + m, where, d, blog);
    if (mode == Mode::kCanonical) {
      check_bitwise("crossentropy_forward loss canonical", where, loss_fwd, sloss);
      check_bitwise("crossentropy_forward_backward loss canonical", where, loss, sloss);
      check_bitwise("crossentropy_forward_backward dlogits canonical", where, d, sd);
    }
  }
}

// A NaN/Inf logit poisons its row exactly as the reference's formulas do (both modes).
RC_GTEST_PROP(CrossEntropyProperty, NonFinitePropagatesLikeTheReference, ()) {
  const int64_t N = gen_dim(5), V = gen_dim(80);
  const std::string where = shape_str({{"N", N}, {"V", V}});
  const auto logits = with_nonfinite(gen_values(N * V));
  const auto targets = *rc::gen::container<std::vector<int32_t>>(
      static_cast<size_t>(N), rc::gen::inRange<int32_t>(0, static_cast<int32_t>(V)));
  auto rd = doubles(logits);
  std::vector<double> rloss(N);
  reference::crossentropy_forward_backward<double>(N, V, 0.5, rloss.data(), rd.data(), targets.data());
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = where + " " + std::string(mode_name(mode));
    std::vector<float> loss(N), d = logits;
    cpu::crossentropy_forward_backward(mode, {N, V}, 0.5f, loss.data(), d.data(), targets.data());
    check_nonfinite_pattern("crossentropy loss", m, loss, rloss);
    check_nonfinite_pattern("crossentropy dlogits", m, d, rd);
  }
}

}  // namespace
}  // namespace lockstep::prop
