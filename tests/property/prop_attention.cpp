// Properties of causal attention with grouped key/value heads (forward: out and the cached att;
// backward: dq, dk, dv) and of RoPE (both directions), both modes.
//
// Reference: Bounded<double> (reference/attention.hpp; MPFR would cost seconds per case at these
// sizes, and the double values sit 2^-29 below the fp32 bounds). Canonical mode is also bitwise
// equal to spec.hpp. Shapes: B in [1,2], T up to 70 (rows past one chunk of 64), NKV in [1,3],
// groups of 1-3 query heads, odd and prime head sizes. Each case picks a value scale from 2^0 to
// 2^6, so some score rows are nearly one-hot and some reach |s| > 88, where a softmax without the
// max subtraction overflows.
#include <string>
#include <vector>

#include "kernels/ops/attention.hpp"
#include "kernels/ops/rope.hpp"
#include "reference/attention.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {


AttentionShape gen_shape(bool even_hs) {
  AttentionShape s{};
  s.B = *rc::gen::inRange<int64_t>(1, 3);
  s.T = *rc::gen::weightedOneOf<int64_t>(
      {{3, rc::gen::inRange<int64_t>(1, 20)}, {1, rc::gen::element<int64_t>(1, 2, 63, 64, 65, 70)}});
  s.NKV = *rc::gen::inRange<int64_t>(1, 4);
  s.NH = s.NKV * *rc::gen::inRange<int64_t>(1, 4);
  s.HS = even_hs ? 2 * *rc::gen::inRange<int64_t>(1, 6) : gen_dim(11);
  return s;
}

std::string describe(const AttentionShape& s) {
  return shape_str({{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"NKV", s.NKV}, {"HS", s.HS}});
}

RC_GTEST_PROP(AttentionProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  const AttentionShape s = gen_shape(false);
  // Cap the work of one case (the Bounded reference is O(B·NH·T²·HS)).
  RC_PRE(s.B * s.NH * s.T * s.T * s.HS <= 120000);
  const int scale_exp = *rc::gen::element(0, 3, 6);
  const std::string where = describe(s) + " scale_exp=" + std::to_string(scale_exp);
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS;
  const int64_t n_qkv = s.B * s.T * row, n_out = s.B * s.T * s.NH * s.HS,
                n_att = s.B * s.NH * s.T * s.T;
  const auto qkv = gen_values(n_qkv, ValueKinds{scale_exp, true, true, 0});
  const auto dout = gen_values(n_out);
  const spec::AttentionDims sd{s.B, s.T, s.NH, s.NKV, s.HS};

  const auto bqkv = bounded<double>(qkv), bdo = bounded<double>(dout);
  std::vector<BD> rout(n_out), ratt(n_att);
  reference::attention_forward(s.B, s.T, s.NH, s.NKV, s.HS, rout.data(), ratt.data(), bqkv.data());
  std::vector<float> sout(n_out), satt(n_att);
  spec::attention_forward(sd, sout.data(), satt.data(), qkv.data());

  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    std::vector<float> out(n_out), att(n_att), dqkv(n_qkv), scratch(n_att);
    cpu::attention_forward(mode, s, out.data(), att.data(), qkv.data());
    check_within("attention_forward out " + m, where, out, rout);
    check_within("attention_forward att " + m, where, att, ratt);
    // Backward as a function of its inputs: this mode's cached att, fed to the reference too.
    const auto batt = bounded<double>(att);
    std::vector<BD> rdqkv(n_qkv), rscratch(n_att);
    reference::attention_backward(s.B, s.T, s.NH, s.NKV, s.HS, rdqkv.data(), rscratch.data(),
                                  bdo.data(), bqkv.data(), batt.data());
    cpu::attention_backward(mode, s, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data());
    check_within("attention_backward dqkv " + m, where, dqkv, rdqkv);
    if (mode == Mode::kCanonical) {
      check_bitwise("attention_forward out canonical", where, out, sout);
      check_bitwise("attention_forward att canonical", where, att, satt);
      std::vector<float> sdqkv(n_qkv);
      spec::attention_backward(sd, sdqkv.data(), dout.data(), qkv.data(), att.data());
      check_bitwise("attention_backward dqkv canonical", where, dqkv, sdqkv);
    }
  }
}

// A NaN/Inf in q, k or v reaches exactly the outputs the reference's formulas send it to.
RC_GTEST_PROP(AttentionProperty, NonFinitePropagatesLikeTheReference, ()) {
  const AttentionShape s = gen_shape(false);
  RC_PRE(s.B * s.NH * s.T * s.T * s.HS <= 120000);
  const std::string where = describe(s);
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS;
  const auto qkv = with_nonfinite(gen_values(s.B * s.T * row));
  std::vector<double> rout(s.B * s.T * s.NH * s.HS), ratt(s.B * s.NH * s.T * s.T);
  const auto dq = doubles(qkv);
  reference::attention_forward<double>(s.B, s.T, s.NH, s.NKV, s.HS, rout.data(), ratt.data(), dq.data());
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = where + " " + std::string(mode_name(mode));
    std::vector<float> out(rout.size()), att(ratt.size());
    cpu::attention_forward(mode, s, out.data(), att.data(), qkv.data());
    check_nonfinite_pattern("attention_forward out", m, out, rout);
    check_nonfinite_pattern("attention_forward att", m, att, ratt);
  }
}

// RoPE rotates q and k heads by the fp32 tables, v untouched; backward is the transpose. No
// reductions and no mode: each element is (x·c) − (y·s) or (x·s) + (y·c), so within the
// Bounded<double> bound and bitwise equal to that expression.
RC_GTEST_PROP(RopeProperty, RotationWithinBoundAndBitwise, ()) {
  const AttentionShape s = gen_shape(true);
  const std::string where = describe(s);
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS, half = s.HS / 2, n = s.B * s.T * row;
  std::vector<float> cos_t(s.T * half), sin_t(s.T * half);
  cpu::rope_tables(s.T, s.HS, 10000.0, cos_t.data(), sin_t.data());
  const auto x = gen_values(n, ValueKinds{3, true, true, 100});
  const auto bc = bounded<double>(cos_t), bs = bounded<double>(sin_t);
  for (bool forward : {true, false}) {
    const std::string what = forward ? "rope_forward" : "rope_backward";
    auto ref = bounded<double>(x);
    std::vector<float> got = x, want = x;
    if (forward) {
      reference::rope_forward(s.B, s.T, s.NH, s.NKV, s.HS, ref.data(), bc.data(), bs.data());
      cpu::rope_forward(s, got.data(), cos_t.data(), sin_t.data());
    } else {
      reference::rope_backward(s.B, s.T, s.NH, s.NKV, s.HS, ref.data(), bc.data(), bs.data());
      cpu::rope_backward(s, got.data(), cos_t.data(), sin_t.data());
    }
    for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
      const int64_t t = bt % s.T;
      for (int64_t head = 0; head < s.NH + s.NKV; ++head) {
        float* p = want.data() + bt * row + head * s.HS;
        for (int64_t i = 0; i < half; ++i) {
          const float a = p[i], b = p[i + half], c = cos_t[t * half + i], sn = sin_t[t * half + i];
          p[i] = forward ? (a * c) - (b * sn) : (a * c) + (b * sn);
          p[i + half] = forward ? (a * sn) + (b * c) : (b * c) - (a * sn);
        }
      }
    }
    check_within(what + " qkv", where, got, ref);
    check_bitwise(what + " qkv", where, got, want);
  }
}

}  // namespace
}  // namespace lockstep::prop
