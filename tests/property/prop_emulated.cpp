// Canonical-mode kernels against the emulated canonical fp32 reference (reference::CanonicalF32:
// every operation rounded to fp32, the canonical chunked reductions, the project's exp/log/tanh):
// the templated reference ops instantiated with that type must equal the kernels bit for bit.
// This is independent of spec.hpp (a second transcription of the same contract, written by
// another hand), so a contract misreading in either shows up as a disagreement.
//
// Covered: linear forward, LayerNorm/RMSNorm forward, GELU/SwiGLU forward and backward,
// cross-entropy (losses and dlogits), attention forward. Compiled only where
// reference/canonical_f32.hpp exists.
#if __has_include("reference/canonical_f32.hpp")

#include <string>
#include <vector>

#include "kernels/ops/activation.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/norm.hpp"
#include "reference/activation.hpp"
#include "reference/attention.hpp"
#include "reference/canonical_f32.hpp"
#include "reference/crossentropy.hpp"
#include "reference/linear.hpp"
#include "reference/norm.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {

using reference::CanonicalF32;

std::vector<CanonicalF32> emulated(const std::vector<float>& x) {
  return std::vector<CanonicalF32>(x.begin(), x.end());
}
std::vector<float> floats(const std::vector<CanonicalF32>& x) {
  std::vector<float> r;
  r.reserve(x.size());
  for (const auto& v : x) r.push_back(v.v);
  return r;
}

RC_GTEST_PROP(EmulatedCanonicalProperty, LinearAndNormsBitwise, ()) {
  const int64_t N = gen_dim(9), IC = gen_dim(150), OC = gen_dim(9);
  const std::string where = shape_str({{"N", N}, {"IC", IC}, {"OC", OC}});
  const auto inp = gen_values(N * IC, {3, true, true, 40});
  const auto w = gen_values(OC * IC), b = gen_values(OC), nw = gen_values(IC), nb = gen_values(IC);
  const auto ei = emulated(inp), ew = emulated(w), eb = emulated(b), enw = emulated(nw),
             enb = emulated(nb);

  std::vector<CanonicalF32> rout(N * OC);
  reference::linear_forward(N, IC, OC, rout.data(), ei.data(), ew.data(), eb.data());
  std::vector<float> out(N * OC);
  cpu::linear_forward(Mode::kCanonical, {N, IC, OC}, out.data(), inp.data(), w.data(), b.data());
  check_bitwise("emulated linear_forward out", where, out, floats(rout));

  const NormShape ns{N, IC, 1e-5f};
  std::vector<CanonicalF32> lo(N * IC), lm(N), lr(N);
  reference::layernorm_forward(N, IC, ns.eps, lo.data(), lm.data(), lr.data(), ei.data(), enw.data(),
                               enb.data());
  std::vector<float> ko(N * IC), km(N), kr(N);
  cpu::layernorm_forward(Mode::kCanonical, ns, ko.data(), km.data(), kr.data(), inp.data(),
                         nw.data(), nb.data());
  check_bitwise("emulated layernorm_forward out", where, ko, floats(lo));
  check_bitwise("emulated layernorm_forward rstd", where, kr, floats(lr));

  reference::rmsnorm_forward(N, IC, ns.eps, lo.data(), lr.data(), ei.data(), enw.data());
  cpu::rmsnorm_forward(Mode::kCanonical, ns, ko.data(), kr.data(), inp.data(), nw.data());
  check_bitwise("emulated rmsnorm_forward out", where, ko, floats(lo));
  check_bitwise("emulated rmsnorm_forward rstd", where, kr, floats(lr));
}

RC_GTEST_PROP(EmulatedCanonicalProperty, ActivationsAndCrossEntropyBitwise, ()) {
  const int64_t N = gen_dim(7), F = gen_dim(70), V = gen_dim(150);
  const std::string where = shape_str({{"N", N}, {"F", F}, {"V", V}});
  const auto x = gen_values(N * 2 * F), dout = gen_values(N * 2 * F);
  const auto ex = emulated(x), ed = emulated(dout);
  std::vector<CanonicalF32> r(N * 2 * F), rd(N * 2 * F);
  std::vector<float> k(N * 2 * F), kd(N * 2 * F);
  reference::gelu_forward(N * 2 * F, r.data(), ex.data());
  reference::gelu_backward(N * 2 * F, rd.data(), ex.data(), ed.data());
  cpu::gelu_forward(Mode::kCanonical, N * 2 * F, k.data(), x.data());
  cpu::gelu_backward(Mode::kCanonical, N * 2 * F, kd.data(), x.data(), dout.data());
  check_bitwise("emulated gelu_forward out", where, k, floats(r));
  check_bitwise("emulated gelu_backward dinp", where, kd, floats(rd));

  std::vector<CanonicalF32> so(N * F);
  std::vector<float> kso(N * F);
  reference::swiglu_forward(N, F, so.data(), ex.data());
  reference::swiglu_backward(N, F, rd.data(), ex.data(), ed.data());
  cpu::swiglu_forward(Mode::kCanonical, N, F, kso.data(), x.data());
  cpu::swiglu_backward(Mode::kCanonical, N, F, kd.data(), x.data(), dout.data());
  check_bitwise("emulated swiglu_forward out", where, kso, floats(so));
  check_bitwise("emulated swiglu_backward dinp", where, kd, floats(rd));

  auto logits = gen_values(N * V, {4, true, true, 0});
  const auto targets = *rc::gen::container<std::vector<int32_t>>(
      static_cast<size_t>(N), rc::gen::inRange<int32_t>(0, static_cast<int32_t>(V)));
  auto el = emulated(logits);
  std::vector<CanonicalF32> rl(N);
  reference::crossentropy_forward_backward(N, V, CanonicalF32(0.25f), rl.data(), el.data(),
                                           targets.data());
  std::vector<float> kl(N);
  cpu::crossentropy_forward_backward(Mode::kCanonical, {N, V}, 0.25f, kl.data(), logits.data(),
                                     targets.data());
  check_bitwise("emulated crossentropy loss", where, kl, floats(rl));
  check_bitwise("emulated crossentropy dlogits", where, logits, floats(el));
}

RC_GTEST_PROP(EmulatedCanonicalProperty, AttentionForwardBitwise, ()) {
  AttentionShape s{};
  s.B = *rc::gen::inRange<int64_t>(1, 3);
  s.T = *rc::gen::element<int64_t>(1, 2, 5, 17, 65);
  s.NKV = *rc::gen::inRange<int64_t>(1, 3);
  s.NH = s.NKV * *rc::gen::inRange<int64_t>(1, 3);
  s.HS = gen_dim(9);
  const std::string where =
      shape_str({{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"NKV", s.NKV}, {"HS", s.HS}});
  const auto qkv = gen_values(s.B * s.T * (s.NH + 2 * s.NKV) * s.HS);
  const auto eq = emulated(qkv);
  std::vector<CanonicalF32> ro(s.B * s.T * s.NH * s.HS), ra(s.B * s.NH * s.T * s.T);
  reference::attention_forward(s.B, s.T, s.NH, s.NKV, s.HS, ro.data(), ra.data(), eq.data());
  std::vector<float> ko(ro.size()), ka(ra.size());
  cpu::attention_forward(Mode::kCanonical, s, ko.data(), ka.data(), qkv.data());
  check_bitwise("emulated attention_forward out", where, ko, floats(ro));
  check_bitwise("emulated attention_forward att", where, ka, floats(ra));
}

}  // namespace
}  // namespace lockstep::prop

#endif  // __has_include("reference/canonical_f32.hpp")
