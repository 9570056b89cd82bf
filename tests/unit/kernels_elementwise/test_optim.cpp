// AdamW, gradient sum of squares and scaling: AdamW within the Bounded<double> reference's bounds
// over several steps and bitwise equal to its scalar formula at any thread count; the canonical
// sum of squares equals canonical_dot(g, g), is invariant under threads and under splitting the
// buffer at a multiple of 64; both modes within the reference's bound.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/optim.hpp"
#include "reference/optim.hpp"
#include "support.hpp"

namespace lockstep::test {
namespace {

AdamWParams adamw_params(int step) {
  const float b1 = 0.9f, b2 = 0.95f;
  return {1e-2f, b1, b2, 1e-8f, 0.1f,
          1.0f - std::pow(b1, static_cast<float>(step)), 1.0f - std::pow(b2, static_cast<float>(step))};
}

// The header's per-element formula, scalar.
void adamw_contract(int64_t n, AdamWParams h, float* p, float* m, float* v, const float* g) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * g[i];
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * (g[i] * g[i]);
    const float mhat = m[i] / h.bc1, vhat = v[i] / h.bc2;
    p[i] = p[i] - h.lr * (mhat / (std::sqrt(vhat) + h.eps) + h.weight_decay * p[i]);
  }
}

TEST(AdamW, StepsWithinReferenceBoundsAndBitwiseEqualToFormula) {
  const int64_t n = 1031;
  std::vector<float> p = random_floats(n, 8000, -1.0f, 1.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<float> cp = p, cm = m, cv = v;
  auto bp = to_bounded(p), bm = to_bounded(m), bv = to_bounded(v);
  for (int step = 1; step <= 4; ++step) {
    const auto g = random_floats(n, 8000 + step, -0.5f, 0.5f);
    const AdamWParams h = adamw_params(step);
    // Every thread count must produce the contract's bits from the same state.
    const auto got = expect_thread_invariant("adamw step " + std::to_string(step), [&] {
      std::vector<float> tp = p, tm = m, tv = v;
      cpu::adamw_update(n, h, tp.data(), tm.data(), tv.data(), g.data());
      return concat({&tp, &tm, &tv});
    });
    std::copy(got.begin(), got.begin() + n, p.begin());
    std::copy(got.begin() + n, got.begin() + 2 * n, m.begin());
    std::copy(got.begin() + 2 * n, got.end(), v.begin());
    adamw_contract(n, h, cp.data(), cm.data(), cv.data(), g.data());
    expect_bitwise("adamw vs formula step " + std::to_string(step), concat({&p, &m, &v}),
                   concat({&cp, &cm, &cv}));
    const auto bg = to_bounded(g);
    reference::adamw_update<Bd>(n, {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.bc1, h.bc2},
                                bp.data(), bm.data(), bv.data(), bg.data());
    const std::string s = " step " + std::to_string(step);
    expect_within("adamw param" + s, p, bp);
    expect_within("adamw m" + s, m, bm);
    expect_within("adamw v" + s, v, bv);
  }
}

float sumsq(Mode mode, const std::vector<float>& g, std::vector<int64_t> splits = {}) {
  ChunkCombiner acc;
  splits.push_back(static_cast<int64_t>(g.size()));
  int64_t i0 = 0;
  for (int64_t i1 : splits) {
    cpu::grad_sumsq_accumulate(mode, i1 - i0, acc, g.data() + i0);
    i0 = i1;
  }
  return acc.finish();
}

TEST(GradSumsq, CanonicalIsCanonicalDotAndSplitAndThreadInvariant) {
  for (int64_t n : {1, 63, 64, 65, 1000, 100003}) {
    // Magnitudes spread over 2^±20 so that chunk partials differ widely and the exact combine matters.
    auto g = random_floats(n, 9000 + static_cast<uint32_t>(n), -1.0f, 1.0f);
    for (int64_t i = 0; i < n; i += 7) g[i] *= 0x1p20f;
    for (int64_t i = 3; i < n; i += 11) g[i] *= 0x1p-20f;
    const auto got = expect_thread_invariant("grad sumsq n=" + std::to_string(n), [&] {
      return std::vector<float>{sumsq(Mode::kCanonical, g)};
    });
    expect_bitwise("grad sumsq vs canonical_dot n=" + std::to_string(n), got,
                   {canonical_dot(g.data(), 1, g.data(), 1, n)});
    if (n > 128) {
      expect_bitwise("grad sumsq split at 64, 128", {sumsq(Mode::kCanonical, g, {64, 128})}, got);
      expect_bitwise("grad sumsq split at n/2 rounded to 64",
                     {sumsq(Mode::kCanonical, g, {n / 2 / 64 * 64})}, got);
    }
  }
}

TEST(GradSumsq, WithinReferenceBoundBothModes) {
  for (Mode mode : kModes) {
    for (int64_t n : {1, 65, 4097, 100003}) {
      const auto g = random_floats(n, 9500 + static_cast<uint32_t>(n), -3.0f, 3.0f);
      const auto bg = to_bounded(g);
      Bd want = 0;
      reference::grad_sumsq_accumulate<Bd>(n, want, bg.data());
      const float got = sumsq(mode, g);
      expect_within("grad sumsq " + std::string(mode_name(mode)) + " n=" + std::to_string(n),
                    &got, &want, 1);
    }
  }
}

TEST(ScaleInplace, OneMultiplyPerElement) {
  const int64_t n = 777;
  const auto g = random_floats(n, 9900, -5.0f, 5.0f);
  const float scale = 0.3f;
  const auto got = expect_thread_invariant("scale_inplace", [&] {
    std::vector<float> x = g;
    cpu::scale_inplace(n, x.data(), scale);
    return x;
  });
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] * scale;
  expect_bitwise("scale_inplace vs g * scale", got, want);
  auto bg = to_bounded(g);
  reference::scale_inplace<Bd>(n, bg.data(), scale);
  expect_within("scale_inplace", got, bg);
}

}  // namespace
}  // namespace lockstep::test
