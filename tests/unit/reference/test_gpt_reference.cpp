// The whole-model reference (reference/gpt.hpp):
//  - its backward against central finite differences of its own loss in MPFR at 256 bits, along
//    random directions in parameter space (Richardson h/2h estimate of the truncation error,
//    Bounded<Mpfr> bounds on every rounding);
//  - CanonicalF32 equal to the canonical trainer step bit for bit, and Bounded<mpfr> bounding the
//    fast-mode step, through the `verify step` engine on in-memory state, for model variants
//    (GELU/SwiGLU, LayerNorm/RMSNorm, learned/RoPE, tied/untied, GQA, micro-batches);
//  - a one-ulp change of one trainer element is caught and named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "reference/gpt.hpp"
#include "reference/real.hpp"
#include "src/model/model.hpp"
#include "tests/support/step_states.hpp"
#include "verify/core/bounds.hpp"
#include "verify/step.hpp"

namespace lockstep {
namespace {

using reference::Mpfr;

ModelConfig fd_model(bool variant) {
  return {.vocab_size = 11, .seq_len = 4, .d_model = 8, .n_layers = 2, .n_heads = 2, .n_kv_heads = variant ? 1 : 2,
          .ffn_hidden = variant ? 8 : 16, .ffn = variant ? FfnKind::kSwiglu : FfnKind::kGelu,
          .norm = variant ? NormKind::kRmsNorm : NormKind::kLayerNorm,
          .pos = variant ? PosKind::kRope : PosKind::kLearned, .tie_embeddings = !variant, .bias = !variant};
}

// Bounded<Mpfr> charges every operation the rounding of the MPFR precision in use (u = 2^-p) and
// every exp/log/tanh one unit (MPFR rounds them correctly); MPFR's exponent range has no
// underflow, and its RoPE angles carry no double error. Its values are then MPFR's own and its
// bounds hold for the p-bit evaluation itself.
reference::BoundedFormat mpfr_bounded_format(int bits) { return {bounds::unit_roundoff(bits), 1.0, 0.0, 0.0}; }

// d/dh L(θ + h·r) at h = 0 by central differences vs Σ grad·r from the reference backward, all in
// Bounded<Mpfr> at p = 256 bits so that every rounding error in the check is bounded, not guessed:
//  - θ and r are fp32 values (normal(0, 0.5) draws, far below 2^40; last bit >= 2^-149) and
//    h = 2^-60, so θ_i + t·h·r_i (t = ±1, ±2) lies between 2^41 and a last bit >= 2^-210: fewer
//    than 256 bits, the perturbed points are exact;
//  - D̂(h) = fl(fl(L̂₊ − L̂₋)/2h) is off from (L(θ+hr) − L(θ−hr))/2h by at most
//    r(h) = central_difference_rounding_bound(u, E₊, E₋, h, |D̂(h)|), E± the loss's Bounded errors;
//  - truncation: D(h) = D + c·h² + O(h⁴), so D(2h) − D(h) = 3c·h² + O(h⁴) and
//    |D(2h) − D(h)| bounds D(h)'s truncation with a factor 3 to spare for the O(h⁴) term; from the
//    computed D̂'s that difference is at most |D̂(2h) − D̂(h)| + r(h) + r(2h);
//  - the analytic Σ grad·r carries its own Bounded error E_a (backward and dot product).
// Tolerance: |D̂(2h) − D̂(h)| + 2·r(h) + r(2h) + E_a.
// The check must also resolve the gradient to many more digits than fp64 has (issue 3): the
// tolerance must stay below u_64²·|Σ grad·r| (about 32 digits), so a backward right only to fp64
// accuracy (an error of u_64·|Σ grad·r|) would fail it.
void check_finite_differences(bool variant) {
  constexpr int kBits = 256;
  using Real = reference::MpfrBounded;
  reference::ScopedMpfrBits bits(kBits);
  reference::ScopedBoundedFormat format(mpfr_bounded_format(kBits));
  const double u = bounds::unit_roundoff(kBits);
  const ModelConfig d = fd_model(variant);
  const int64_t B = 2, BT = B * d.seq_len;
  reference::GptReference<Real> ref(describe_model(d), B);
  std::mt19937 rng(variant ? 7 : 3);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const size_t n = ref.params.size();
  std::vector<Mpfr> theta(n);
  for (size_t i = 0; i < n; ++i) theta[i] = Mpfr(normal(rng));
  std::vector<int32_t> inputs(BT), targets(BT);
  for (auto& t : inputs) t = static_cast<int32_t>(rng() % d.vocab_size);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % d.vocab_size);

  for (size_t i = 0; i < n; ++i) ref.params[i] = Real(theta[i]);
  ref.forward_backward(inputs.data(), targets.data(), {0, BT}, 1.0f / static_cast<float>(BT));
  const std::vector<Real> grad = ref.grads();

  auto loss_at = [&](const std::vector<Mpfr>& r, const Mpfr& h) {
    for (size_t i = 0; i < n; ++i) ref.params[i] = Real(Mpfr(theta[i] + h * r[i]));
    return ref.loss(inputs.data(), targets.data());
  };
  // D̂(h) and its rounding bound r(h).
  auto central = [&](const std::vector<Mpfr>& r, const Mpfr& h, double* rounding) {
    const Real plus = loss_at(r, h), minus = loss_at(r, -h);
    const Mpfr D = (plus.value - minus.value) / (2 * h);
    *rounding = bounds::central_difference_rounding_bound(
        u, static_cast<double>(plus.err), static_cast<double>(minus.err), static_cast<double>(h),
        static_cast<double>(abs(D)));
    return D;
  };
  const Mpfr h = boost::multiprecision::ldexp(Mpfr(1), -60);
  for (int dir = 0; dir < 3; ++dir) {
    std::vector<Mpfr> r(n);
    for (auto& x : r) x = Mpfr(normal(rng));
    Real analytic = 0;
    for (size_t i = 0; i < n; ++i) analytic += grad[i] * Real(r[i]);
    double r_h = 0, r_2h = 0;
    const Mpfr d1 = central(r, h, &r_h);
    const Mpfr d2 = central(r, 2 * h, &r_2h);
    const Mpfr trunc = abs(d2 - d1);
    const Mpfr tol = trunc + Mpfr(2 * r_h + r_2h) + analytic.err;
    const Mpfr a = abs(analytic.value);
    const Mpfr diff = abs(d1 - analytic.value);
    std::printf("variant %d direction %d: analytic %.12e, |fd - analytic| / |analytic| = %.3e "
                "(%.1f digits), tolerance / |analytic| = %.3e (Richardson truncation %.3e, "
                "rounding %.3e), tightness %.3g\n",
                variant ? 1 : 0, dir, static_cast<double>(analytic.value),
                static_cast<double>(diff / a), static_cast<double>(-log10(diff / a)),
                static_cast<double>(tol / a), static_cast<double>(trunc),
                static_cast<double>(Mpfr(2 * r_h + r_2h) + analytic.err),
                static_cast<double>(diff / tol));
    EXPECT_LE(diff, tol) << "direction " << dir;
    EXPECT_LT(tol, Mpfr(bounds::kUnitF64) * Mpfr(bounds::kUnitF64) * a)
        << "direction " << dir << ": the check no longer resolves the gradient beyond fp64";
  }
}

TEST(GptReference, BackwardMatchesMpfrFiniteDifferences) { check_finite_differences(false); }
TEST(GptReference, BackwardMatchesMpfrFiniteDifferencesRopeSwigluRmsGqa) {
  check_finite_differences(true);
}

// Blocks of different MLP widths, and a third block without attention: a model no [model] section
// describes, built from the layer list alone.
void uneven_blocks(ModelDesc& d) {
  int64_t width = 32;
  for (auto& l : d.layers) {
    if (l.kind == LayerKind::kMlp) {
      l.dims.F = width;
      width += 64;
    }
  }
  LayerDesc extra = d.layers[d.layers.size() - 3];  // the last MLP, as block 2
  extra.block = 2;
  extra.prefix = "layer/2/";
  extra.dims.F = 16;
  d.layers.insert(d.layers.end() - 2, extra);
}

TEST(VerifyStep, CanonicalEqualsCanonicalF32Bitwise) {
  expect_verify_pass(verify::verify_step(tiny_state(Mode::kCanonical, false), {}));
}
TEST(VerifyStep, CanonicalEqualsCanonicalF32BitwiseRopeSwigluRmsGqaUntied) {
  expect_verify_pass(verify::verify_step(tiny_state(Mode::kCanonical, true), {}));
}
TEST(VerifyStep, FastWithinBoundedMpfr) {
  verify::StepOptions opt;
  opt.reference_bits = 128;
  expect_verify_pass(verify::verify_step(tiny_state(Mode::kFast, false), opt));
}
TEST(VerifyStep, FastWithinBoundedMpfrRopeSwigluRmsGqaUntied) {
  verify::StepOptions opt;
  opt.reference_bits = 128;
  expect_verify_pass(verify::verify_step(tiny_state(Mode::kFast, true), opt));
}

TEST(VerifyStep, ModelOfUnevenBlocksFromTheLayerList) {
  const verify::StepState canonical = tiny_state(Mode::kCanonical, false, uneven_blocks);
  // What the list says is what runs: the widths and the extra block's tensors are there.
  EXPECT_EQ(build_param_layout(canonical.model)[0].name, "wte");
  std::vector<std::string> fc;
  for (const auto& t : build_param_layout(canonical.model)) {
    if (t.name.ends_with("mlp/fc/weight")) fc.push_back(t.name + " " + std::to_string(t.shape[0]));
  }
  EXPECT_EQ(fc, (std::vector<std::string>{"layer/0/mlp/fc/weight 32", "layer/1/mlp/fc/weight 96",
                                          "layer/2/mlp/fc/weight 16"}));
  expect_verify_pass(verify::verify_step(canonical, {}));
  verify::StepOptions opt;
  opt.reference_bits = 128;
  expect_verify_pass(verify::verify_step(tiny_state(Mode::kFast, true, uneven_blocks), opt));
}

TEST(VerifyStep, OneUlpPerturbationIsCaughtAndNamed) {
  verify::StepOptions opt;
  opt.perturb = "grad/layer/1/attn/qkv";
  const auto r = verify::verify_step(tiny_state(Mode::kCanonical, false), opt);
  EXPECT_FALSE(r.ok());
  ASSERT_NE(r.worst(), nullptr);
  EXPECT_EQ(r.worst()->name, "grad/layer/1/attn/qkv");
  EXPECT_EQ(r.worst()->cmp.max_ulp, 1u);
}

}  // namespace
}  // namespace lockstep
