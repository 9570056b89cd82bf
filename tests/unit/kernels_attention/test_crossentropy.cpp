// Softmax cross-entropy kernels (kernels/cpu/crossentropy.cpp) against the Bounded<double>
// reference (both modes, fused and forward only), against a scalar transcription of the canonical
// contract (bitwise, 1/2/3 threads), uniform logits against log V, NaN propagation, bad targets,
// and the reference's backward against MPFR finite differences.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/transcendental.hpp"
#include "reference/crossentropy.hpp"
#include "src/core/check.hpp"
#include "tests/support/bounded_compare.hpp"
#include "tests/support/mpfr_fd.hpp"
#include "tests/support/random_values.hpp"

namespace lockstep {
namespace {

using test::Bd;

std::vector<int32_t> random_targets(int64_t N, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> t(N);
  for (auto& y : t) y = dist(gen);
  return t;
}

// V = 1, primes below and above the chunk, and a vocabulary of many chunks.
const std::vector<CrossEntropyShape> kShapes = {{3, 1}, {5, 61}, {4, 67}, {7, 1031}, {2, 5003}};

TEST(CrossEntropy, BothModesWithinBoundedReference) {
  const float dloss = 1.0f / 7.0f;
  for (const auto s : kShapes) {
    const auto logits = test::random_floats(s.N * s.V, 11, -8.0f, 8.0f);
    const auto targets = random_targets(s.N, s.V, 12);
    auto rl = test::to_bounded(logits);
    std::vector<Bd> rloss(s.N), rfwd(s.N);
    reference::crossentropy_forward(s.N, s.V, rfwd.data(), rl.data(), targets.data());
    reference::crossentropy_forward_backward(s.N, s.V, Bd(dloss), rloss.data(), rl.data(),
                                             targets.data());
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      std::cout << "N=" << s.N << " V=" << s.V << " " << mode_name(mode) << "\n";
      std::vector<float> loss(s.N), fwd(s.N), d = logits;
      cpu::crossentropy_forward_backward(mode, s, dloss, loss.data(), d.data(), targets.data());
      cpu::crossentropy_forward(mode, s, fwd.data(), logits.data(), targets.data());
      test::expect_within("loss", loss, rloss);
      test::expect_within("dlogits", d, rl);
      test::expect_bitwise("forward-only loss", fwd, loss);
    }
  }
}

// The canonical contract of kernels/ops/crossentropy.hpp with canonical.hpp's canonical_sum over
// the stored exponentials.
void contract(CrossEntropyShape s, float dloss, float* losses, float* logits, const int32_t* targets) {
  std::vector<float> e(s.V);
  for (int64_t n = 0; n < s.N; ++n) {
    float* x = logits + n * s.V;
    float m = -INFINITY;
    for (int64_t v = 0; v < s.V; ++v) m = std::max(m, x[v]);
    for (int64_t v = 0; v < s.V; ++v) e[v] = ls_expf(x[v] - m);
    const float Z = canonical_sum(e.data(), 1, s.V);
    losses[n] = (m + ls_logf(Z)) - x[targets[n]];
    for (int64_t v = 0; v < s.V; ++v) x[v] = (e[v] / Z - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
  }
}

TEST(CrossEntropy, CanonicalMatchesContractForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  const float dloss = 0.375f;
  for (const auto s : kShapes) {
    const auto logits = test::random_floats(s.N * s.V, 13, -20.0f, 20.0f);
    const auto targets = random_targets(s.N, s.V, 14);
    std::vector<float> want_loss(s.N), want = logits;
    contract(s, dloss, want_loss.data(), want.data(), targets.data());
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> loss(s.N), d = logits;
      cpu::crossentropy_forward_backward(Mode::kCanonical, s, dloss, loss.data(), d.data(),
                                         targets.data());
      SCOPED_TRACE(str_cat("N=", s.N, " V=", s.V, " threads=", threads));
      test::expect_bitwise("loss", loss, want_loss);
      test::expect_bitwise("dlogits", d, want);
    }
  }
  omp_set_num_threads(saved);
}

// Equal logits: loss = log V exactly; the kernel within the reference's bound of it (the double
// log V is off by one double rounding, 2^-29 of an fp32 ulp).
TEST(CrossEntropy, UniformLogitsGiveLogV) {
  for (int64_t V : {2, 61, 50021}) {
    const CrossEntropyShape s{2, V};
    std::vector<float> logits(s.N * V, 0.3f);
    const std::vector<int32_t> targets = {0, static_cast<int32_t>(V - 1)};
    auto rl = test::to_bounded(logits);
    std::vector<Bd> rloss(s.N);
    reference::crossentropy_forward(s.N, V, rloss.data(), rl.data(), targets.data());
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      std::vector<float> loss(s.N);
      cpu::crossentropy_forward(mode, s, loss.data(), logits.data(), targets.data());
      for (int64_t n = 0; n < s.N; ++n) {
        const double err = std::fabs(loss[n] - std::log(static_cast<double>(V)));
        std::cout << "V=" << V << " " << mode_name(mode) << ": |loss − log V| / bound "
                  << err / rloss[n].err << "\n";
        EXPECT_LE(err, rloss[n].err) << "V=" << V << " " << mode_name(mode);
      }
    }
  }
}

TEST(CrossEntropy, NanLogitPoisonsOnlyItsRow) {
  const CrossEntropyShape s{3, 67};
  auto logits = test::random_floats(s.N * s.V, 15);
  logits[1 * s.V + 40] = NAN;
  const std::vector<int32_t> targets = {3, 5, 66};
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    std::vector<float> loss(s.N), d = logits;
    cpu::crossentropy_forward_backward(mode, s, 1.0f, loss.data(), d.data(), targets.data());
    EXPECT_TRUE(std::isfinite(loss[0]) && std::isfinite(loss[2])) << mode_name(mode);
    EXPECT_TRUE(std::isnan(loss[1])) << mode_name(mode);
    for (int64_t v = 0; v < s.V; ++v) {
      EXPECT_TRUE(std::isnan(d[s.V + v])) << mode_name(mode) << " v=" << v;
      EXPECT_TRUE(std::isfinite(d[v]) && std::isfinite(d[2 * s.V + v])) << mode_name(mode);
    }
  }
}

TEST(CrossEntropy, TargetOutsideVocabularyNamesRowAndValue) {
  const CrossEntropyShape s{3, 10};
  std::vector<float> logits(30, 0.0f), loss(3);
  for (int32_t bad : {-1, 10}) {
    const std::vector<int32_t> targets = {0, bad, 9};
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      try {
        cpu::crossentropy_forward(mode, s, loss.data(), logits.data(), targets.data());
        ADD_FAILURE() << "no error for target " << bad;
      } catch (const ConfigError& e) {
        EXPECT_THAT(e.what(), testing::ContainsRegex(str_cat("row 1 is ", bad, ".*\\[0, 10\\)")));
      }
      EXPECT_THROW(cpu::crossentropy_forward_backward(mode, s, 1.0f, loss.data(), logits.data(),
                                                      targets.data()),
                   ConfigError);
    }
  }
}

// Reference backward vs central differences of its forward in 100-digit MPFR, loss
// L = Σ losses·dloss, along a random direction; Richardson (steps h and 2h) bounds the truncation
// error (tests/support/mpfr_fd.hpp).
TEST(CrossEntropy, ReferenceBackwardMatchesMpfrFiniteDifferences) {
  using Real = test::Mpfr100;
  const int64_t N = 3, V = 11;
  const auto xf = test::random_floats(N * V, 16, -4.0f, 4.0f);
  const auto rf = test::random_floats(N * V, 17);
  const auto targets = random_targets(N, V, 18);
  const std::vector<Real> x(xf.begin(), xf.end()), dir(rf.begin(), rf.end());
  const Real dloss = Real(0.625);
  auto loss = [&]<class R>(const R& h) {
    std::vector<R> p(x.size()), l(N);
    for (size_t i = 0; i < x.size(); ++i) p[i] = R(x[i]) + h * R(dir[i]);
    reference::crossentropy_forward(N, V, l.data(), p.data(), targets.data());
    R total = 0;
    for (const auto& li : l) total += li * R(dloss);
    return total;
  };
  auto analytic = [&]<class R>() {
    std::vector<R> g(x.begin(), x.end()), l(N);
    reference::crossentropy_forward_backward(N, V, R(dloss), l.data(), g.data(), targets.data());
    R d = 0;
    for (size_t i = 0; i < g.size(); ++i) d += g[i] * R(dir[i]);
    return d;
  };
  test::expect_matches_central_difference<Real>("cross-entropy", loss, analytic);
}

}  // namespace
}  // namespace lockstep
