// Properties of AdamW and of the gradient sum of squares, both modes.
//
// AdamW has no reductions and one contract for both modes: bitwise equal to spec.hpp's per-element
// transcription and within the Bounded<double> reference's bound (reference/optim.hpp), over
// random hyperparameters and steps t in [1, 1000] (bias corrections from 0.1 to ~1).
// Sum of squares: canonical bitwise equal to the chunked spec (canonical_dot chunks, exact
// combine), also when split between calls at a multiple of 64; fast within the Bounded<Mpfr64>
// dot bound (rigorous). Large gradients are drawn up to 2^50, so Σg² < 2^113 for n < 2^13 stays
// below FLT_MAX, where the running error analysis holds.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops/optim.hpp"
#include "reference/optim.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {

RC_GTEST_PROP(AdamWProperty, BitwiseToSpecAndWithinBound, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(1, 300);
  const int t = *rc::gen::inRange(1, 1001);
  spec::AdamW h{};
  h.lr = *rc::gen::element(1e-3f, 3e-4f, 6e-4f, 1.0f);
  h.beta1 = *rc::gen::element(0.9f, 0.8f, 0.0f);
  h.beta2 = *rc::gen::element(0.95f, 0.999f, 0.99f);
  h.eps = *rc::gen::element(1e-8f, 1e-6f);
  h.weight_decay = *rc::gen::element(0.0f, 0.1f, 0.01f);
  h.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
  h.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta2), t));
  const std::string where = "n=" + std::to_string(n) + " t=" + std::to_string(t) +
                            " lr=" + std::to_string(h.lr) + " beta1=" + std::to_string(h.beta1) +
                            " beta2=" + std::to_string(h.beta2) + " wd=" + std::to_string(h.weight_decay);
  const auto p0 = gen_values(n), m0 = gen_values(n), g = gen_values(n, {3, true, true, 40});
  auto v0 = gen_values(n);
  for (float& x : v0) x = std::fabs(x);  // second moments are non-negative

  const AdamWParams kp{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.bc1, h.bc2};
  std::vector<float> p = p0, m = m0, v = v0;
  cpu::adamw_update(n, kp, p.data(), m.data(), v.data(), g.data());

  std::vector<float> sp = p0, sm = m0, sv = v0;
  for (int64_t i = 0; i < n; ++i) spec::adamw(h, sp[i], sm[i], sv[i], g[i]);
  check_bitwise("adamw_update param", where, p, sp);
  check_bitwise("adamw_update m", where, m, sm);
  check_bitwise("adamw_update v", where, v, sv);

  auto rp = bounded<double>(p0), rm = bounded<double>(m0), rv = bounded<double>(v0);
  const auto rg = bounded<double>(g);
  reference::adamw_update(n, reference::AdamWParams{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.bc1, h.bc2},
                          rp.data(), rm.data(), rv.data(), rg.data());
  check_within("adamw_update param", where, p, rp);
  check_within("adamw_update m", where, m, rm);
  check_within("adamw_update v", where, v, rv);
}

RC_GTEST_PROP(GradSumSqProperty, CanonicalBitwiseSplitInvariantFastWithinMpfrBound, ()) {
  const int64_t n = *rc::gen::weightedOneOf<int64_t>(
      {{3, rc::gen::inRange<int64_t>(1, 700)}, {1, rc::gen::element<int64_t>(1, 63, 64, 65, 128, 4099)}});
  const std::string where = "n=" + std::to_string(n);
  const auto g = gen_values(n, {3, true, true, 50});

  ChunkCombiner want;
  for (int64_t k0 = 0; k0 < n; k0 += kCanonicalChunk) {
    want.add(chunk_dot(g.data() + k0, 1, g.data() + k0, 1, std::min(kCanonicalChunk, n - k0)));
  }
  ChunkCombiner one;
  cpu::grad_sumsq_accumulate(Mode::kCanonical, n, one, g.data());
  check_bitwise("grad_sumsq canonical", where, {one.finish()}, {want.finish()});

  const int64_t split = kCanonicalChunk * *rc::gen::inRange<int64_t>(0, n / kCanonicalChunk + 1);
  ChunkCombiner two;
  cpu::grad_sumsq_accumulate(Mode::kCanonical, n - split, two, g.data() + split);
  cpu::grad_sumsq_accumulate(Mode::kCanonical, split, two, g.data());
  check_bitwise("grad_sumsq canonical split", where + " split=" + std::to_string(split),
                {two.finish()}, {want.finish()});

  const auto bg = bounded<Mpfr64>(g);
  BM ref(0);
  reference::grad_sumsq_accumulate(n, ref, bg.data());
  // The reference's `acc += dot` charges one more rounding, u·|Σg²|: the kernel's final rounding
  // of the combined partials (fast mode: of its double sum) is that rounding.
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    ChunkCombiner acc;
    cpu::grad_sumsq_accumulate(mode, n, acc, g.data());
    const float got = acc.finish();
    check_within("grad_sumsq " + std::string(mode_name(mode)), where, &got, &ref, 1);
  }
}

}  // namespace
}  // namespace lockstep::prop
