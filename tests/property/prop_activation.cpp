// Properties of GELU (tanh form), SwiGLU and the residual add, forward and backward, both modes:
// within the Bounded<double> reference's bound (reference/activation.hpp; these ops have no
// reductions, so the double values are 2^-29 of the fp32 bounds), canonical mode bitwise equal to
// spec.hpp, and the header's special values (NaN, ±inf) in both modes.
//
// Value ranges: GELU and the residual take magnitudes up to 2^127 (the residual's sum may round
// to infinity: the check demands ±inf exactly where the reference interval lies beyond the fp32
// overflow threshold). SwiGLU's gate stays within [-8, 8]: Bounded exp does not model exp's own
// overflow to +inf (for gate < -88.7 the kernel's 1 + exp(-g) is +inf while the reference's is
// finite), so there large magnitudes go to the `up` half only.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops/activation.hpp"
#include "kernels/ops/residual.hpp"
#include "reference/activation.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {

const ValueKinds kWide{3, true, true, 127};
const ValueKinds kModerate{3, true, true, 0};

int64_t gen_len() { return *rc::gen::weightedOneOf<int64_t>({{3, rc::gen::inRange<int64_t>(1, 300)},
                                                              {1, rc::gen::element<int64_t>(1, 7, 8, 16, 17, 1031)}}); }

RC_GTEST_PROP(GeluProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  const int64_t n = gen_len();
  const std::string where = shape_str({{"n", n}});
  const auto x = gen_values(n, kWide), dout = gen_values(n, kModerate);
  const auto bx = bounded<double>(x), bdo = bounded<double>(dout);
  std::vector<BD> rout(n), rdinp(n);
  reference::gelu_forward(n, rout.data(), bx.data());
  reference::gelu_backward(n, rdinp.data(), bx.data(), bdo.data());
  std::vector<float> sout(n), sdinp(n);
  for (int64_t i = 0; i < n; ++i) {
    sout[i] = spec::gelu(x[i]);
    sdinp[i] = spec::gelu_grad(x[i], dout[i]);
  }
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    std::vector<float> out(n), dinp(n);
    cpu::gelu_forward(mode, n, out.data(), x.data());
    cpu::gelu_backward(mode, n, dinp.data(), x.data(), dout.data());
    check_within("gelu_forward out " + m, where, out, rout);
    check_within("gelu_backward dinp " + m, where, dinp, rdinp);
    if (mode == Mode::kCanonical) {
      check_bitwise("gelu_forward out canonical", where, out, sout);
      check_bitwise("gelu_backward dinp canonical", where, dinp, sdinp);
    }
  }
}

RC_GTEST_PROP(SwigluProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  const int64_t N = gen_dim(9), F = gen_dim(70);
  const std::string where = shape_str({{"N", N}, {"F", F}});
  std::vector<float> inp(N * 2 * F);
  for (int64_t r = 0; r < N; ++r) {
    const auto gate = gen_values(F, kModerate), up = gen_values(F, {3, true, true, 120});
    std::copy(gate.begin(), gate.end(), inp.begin() + r * 2 * F);
    std::copy(up.begin(), up.end(), inp.begin() + r * 2 * F + F);
  }
  const auto dout = gen_values(N * F, kModerate);
  const auto binp = bounded<double>(inp), bdo = bounded<double>(dout);
  std::vector<BD> rout(N * F), rdinp(N * 2 * F);
  reference::swiglu_forward(N, F, rout.data(), binp.data());
  reference::swiglu_backward(N, F, rdinp.data(), binp.data(), bdo.data());
  std::vector<float> sout(N * F), sdinp(N * 2 * F);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t f = 0; f < F; ++f) {
      const float g = inp[r * 2 * F + f], up = inp[r * 2 * F + F + f];
      sout[r * F + f] = spec::swiglu(g, up);
      spec::swiglu_grad(g, up, dout[r * F + f], &sdinp[r * 2 * F + f], &sdinp[r * 2 * F + F + f]);
    }
  }
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    std::vector<float> out(N * F), dinp(N * 2 * F);
    cpu::swiglu_forward(mode, N, F, out.data(), inp.data());
    cpu::swiglu_backward(mode, N, F, dinp.data(), inp.data(), dout.data());
    check_within("swiglu_forward out " + m, where, out, rout);
    check_within("swiglu_backward dinp " + m, where, dinp, rdinp);
    if (mode == Mode::kCanonical) {
      check_bitwise("swiglu_forward out canonical", where, out, sout);
      check_bitwise("swiglu_backward dinp canonical", where, dinp, sdinp);
    }
  }
}

// One fp32 add per element: correctly rounded, so the bound is u·|a + b| (plus ±inf beyond the
// overflow threshold), and bitwise equal to a + b.
RC_GTEST_PROP(ResidualProperty, CorrectlyRoundedSumWithOverflow, ()) {
  const int64_t n = gen_len();
  const std::string where = shape_str({{"n", n}});
  const auto a = gen_values(n, kWide), b = gen_values(n, kWide);
  const auto ba = bounded<double>(a), bb = bounded<double>(b);
  std::vector<BD> ref(n);
  reference::residual_forward(n, ref.data(), ba.data(), bb.data());
  std::vector<float> out(n), want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  cpu::residual_forward(n, out.data(), a.data(), b.data());
  check_within("residual_forward out", where, out, ref);
  check_bitwise("residual_forward out", where, out, want);
}

// NaN and ±inf inputs give the header's special values (NaN stays NaN; gelu(+inf) = +inf,
// gelu(-inf) = NaN, silu(+inf) = +inf, silu(-inf) = NaN; gelu'(±inf) from sech² = 0) in both modes:
// the same NaN/Inf pattern as spec.hpp, which transcribes those formulas.
RC_GTEST_PROP(ActivationProperty, NonFiniteInputsGiveTheDocumentedValues, ()) {
  const int64_t N = gen_dim(5), F = gen_dim(9);
  const std::string where = shape_str({{"N", N}, {"F", F}});
  const auto x = with_nonfinite(gen_values(N * 2 * F, kModerate));
  const auto dout = gen_values(N * 2 * F, kModerate);
  std::vector<double> sg(N * 2 * F), sgd(N * 2 * F), ss(N * F), ssd(N * 2 * F), sr(N * 2 * F);
  for (int64_t i = 0; i < N * 2 * F; ++i) {
    sg[i] = spec::gelu(x[i]);
    sgd[i] = spec::gelu_grad(x[i], dout[i]);
    sr[i] = x[i] + dout[i];
  }
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t f = 0; f < F; ++f) {
      const float g = x[r * 2 * F + f], up = x[r * 2 * F + F + f];
      ss[r * F + f] = spec::swiglu(g, up);
      float dg, du;
      spec::swiglu_grad(g, up, dout[r * F + f], &dg, &du);
      ssd[r * 2 * F + f] = dg;
      ssd[r * 2 * F + F + f] = du;
    }
  }
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = where + " " + std::string(mode_name(mode));
    std::vector<float> o(N * 2 * F), d(N * 2 * F), so(N * F), sd(N * 2 * F);
    cpu::gelu_forward(mode, N * 2 * F, o.data(), x.data());
    cpu::gelu_backward(mode, N * 2 * F, d.data(), x.data(), dout.data());
    check_nonfinite_pattern("gelu_forward out", m, o, sg);
    check_nonfinite_pattern("gelu_backward dinp", m, d, sgd);
    cpu::swiglu_forward(mode, N, F, so.data(), x.data());
    cpu::swiglu_backward(mode, N, F, sd.data(), x.data(), dout.data());
    check_nonfinite_pattern("swiglu_forward out", m, so, ss);
    check_nonfinite_pattern("swiglu_backward dinp", m, sd, ssd);
  }
  std::vector<float> r(N * 2 * F);
  cpu::residual_forward(N * 2 * F, r.data(), x.data(), dout.data());
  check_nonfinite_pattern("residual_forward out", where, r, sr);
}

}  // namespace
}  // namespace lockstep::prop
