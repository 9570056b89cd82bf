// The reference checks itself: each reference backward against central finite differences of the
// reference forward, both in 100-bit MPFR, along a random direction of all inputs at once, for the
// scalar loss L = Σ out·w. The tolerance comes from the finite difference's own error estimate:
// D(h) = (L(x+hd) − L(x−hd))/2h has truncation error ≈ (D(2h) − D(h))/3 (Richardson: the error is
// c·h² + O(h⁴)); we allow 2·|D(2h) − D(h)| (six times that estimate) plus the rounding floor of
// the 100-bit evaluations, γ_k(2^-100)·Σ|out·w| / h with k the roundings on any output's path.
#include <gtest/gtest.h>

#include <boost/multiprecision/mpfr.hpp>
#include <functional>

#include "reference/activation.hpp"
#include "reference/embedding.hpp"
#include "reference/moe.hpp"
#include "reference/norm.hpp"
#include "support.hpp"
#include "verify/core/bounds.hpp"

namespace lockstep::test {
namespace {

using Mp = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<100>,
                                         boost::multiprecision::et_off>;
constexpr int kMpBits = 100;

std::vector<Mp> random_mp(int64_t n, uint32_t seed, float lo, float hi) {
  const auto f = random_floats(n, seed, lo, hi);
  return std::vector<Mp>(f.begin(), f.end());
}

// loss(x) returns Σ out·w for the flattened inputs x; grad is the reference backward's gradient
// of the same loss at x0; mag = Σ|out·w| at x0; k = roundings on the longest path to one output.
void check_directional(const std::string& what, const std::function<Mp(const std::vector<Mp>&)>& loss,
                       const std::vector<Mp>& x0, const std::vector<Mp>& grad, const Mp& mag,
                       int64_t k, uint32_t seed) {
  ASSERT_EQ(x0.size(), grad.size());
  const auto dir = random_mp(static_cast<int64_t>(x0.size()), seed, -1.0f, 1.0f);
  Mp analytic = 0;
  for (size_t i = 0; i < x0.size(); ++i) analytic += grad[i] * dir[i];
  const Mp h = Mp(std::ldexp(1.0, -20));
  auto central = [&](const Mp& step) {
    std::vector<Mp> xp = x0, xm = x0;
    for (size_t i = 0; i < x0.size(); ++i) {
      xp[i] += step * dir[i];
      xm[i] -= step * dir[i];
    }
    return (loss(xp) - loss(xm)) / (2 * step);
  };
  const Mp d1 = central(h), d2 = central(2 * h);
  const Mp floor = Mp(bounds::gamma(k, std::ldexp(1.0, -kMpBits))) * mag / h;
  const Mp tol = 2 * abs(d2 - d1) + floor;
  const Mp err = abs(analytic - d1);
  std::cout << what << ": directional derivative " << analytic.convert_to<double>()
            << ", |analytic - FD| " << err.convert_to<double>() << ", Richardson estimate "
            << (abs(d2 - d1) / 3).convert_to<double>() << ", tolerance " << tol.convert_to<double>()
            << " (err/tol " << (err / tol).convert_to<double>() << ")\n";
  EXPECT_LE(err, tol) << what;
  // The check resolves relative errors far below h = 2^-20, so any wrong formula fails it.
  EXPECT_LT(tol, h * abs(analytic)) << what << ": the tolerance is too loose to catch anything";
}

Mp weighted_sum(const std::vector<Mp>& out, const std::vector<Mp>& w, Mp* mag = nullptr) {
  Mp s = 0, m = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    s += out[i] * w[i];
    m += abs(out[i] * w[i]);
  }
  if (mag != nullptr) *mag = m;
  return s;
}

TEST(ReferenceGradient, LayerNormMatchesMpfrFiniteDifferences) {
  const int64_t N = 3, C = 70;
  const auto wl = random_mp(N * C, 11, -1.0f, 1.0f);
  auto forward = [&](const std::vector<Mp>& x, std::vector<Mp>& out, std::vector<Mp>& mean,
                     std::vector<Mp>& rstd) {
    out.resize(N * C);
    mean.resize(N);
    rstd.resize(N);
    reference::layernorm_forward<Mp>(N, C, 1e-5f, out.data(), mean.data(), rstd.data(), x.data(),
                                     x.data() + N * C, x.data() + N * C + C);
  };
  std::vector<Mp> x0 = random_mp(N * C + 2 * C, 12, -2.0f, 2.0f), out, mean, rstd;
  forward(x0, out, mean, rstd);
  Mp mag;
  weighted_sum(out, wl, &mag);
  std::vector<Mp> grad(x0.size(), Mp(0));
  reference::layernorm_backward<Mp>(N, C, grad.data(), grad.data() + N * C, grad.data() + N * C + C,
                                    wl.data(), x0.data(), x0.data() + N * C, mean.data(), rstd.data());
  check_directional("layernorm", [&](const std::vector<Mp>& x) {
    std::vector<Mp> o, m, r;
    forward(x, o, m, r);
    return weighted_sum(o, wl);
  }, x0, grad, mag, 4 * C + 16 + N * C, 13);
}

TEST(ReferenceGradient, RmsNormMatchesMpfrFiniteDifferences) {
  const int64_t N = 4, C = 33;
  const auto wl = random_mp(N * C, 21, -1.0f, 1.0f);
  auto forward = [&](const std::vector<Mp>& x, std::vector<Mp>& out, std::vector<Mp>& rstd) {
    out.resize(N * C);
    rstd.resize(N);
    reference::rmsnorm_forward<Mp>(N, C, 1e-5f, out.data(), rstd.data(), x.data(), x.data() + N * C);
  };
  std::vector<Mp> x0 = random_mp(N * C + C, 22, -2.0f, 2.0f), out, rstd;
  forward(x0, out, rstd);
  Mp mag;
  weighted_sum(out, wl, &mag);
  std::vector<Mp> grad(x0.size(), Mp(0));
  reference::rmsnorm_backward<Mp>(N, C, grad.data(), grad.data() + N * C, wl.data(), x0.data(),
                                  x0.data() + N * C, rstd.data());
  check_directional("rmsnorm", [&](const std::vector<Mp>& x) {
    std::vector<Mp> o, r;
    forward(x, o, r);
    return weighted_sum(o, wl);
  }, x0, grad, mag, 2 * C + 16 + N * C, 23);
}

TEST(ReferenceGradient, GeluMatchesMpfrFiniteDifferences) {
  const int64_t n = 101;
  const auto wl = random_mp(n, 31, -1.0f, 1.0f);
  const std::vector<Mp> x0 = random_mp(n, 32, -5.0f, 5.0f);
  std::vector<Mp> out(n), grad(n);
  reference::gelu_forward<Mp>(n, out.data(), x0.data());
  Mp mag;
  weighted_sum(out, wl, &mag);
  reference::gelu_backward<Mp>(n, grad.data(), x0.data(), wl.data());
  check_directional("gelu", [&](const std::vector<Mp>& x) {
    std::vector<Mp> o(n);
    reference::gelu_forward<Mp>(n, o.data(), x.data());
    return weighted_sum(o, wl);
  }, x0, grad, mag, 16 + n, 33);
}

TEST(ReferenceGradient, SwiGluMatchesMpfrFiniteDifferences) {
  const int64_t N = 3, F = 17;
  const auto wl = random_mp(N * F, 41, -1.0f, 1.0f);
  const std::vector<Mp> x0 = random_mp(N * 2 * F, 42, -6.0f, 6.0f);
  std::vector<Mp> out(N * F), grad(N * 2 * F);
  reference::swiglu_forward<Mp>(N, F, out.data(), x0.data());
  Mp mag;
  weighted_sum(out, wl, &mag);
  reference::swiglu_backward<Mp>(N, F, grad.data(), x0.data(), wl.data());
  check_directional("swiglu", [&](const std::vector<Mp>& x) {
    std::vector<Mp> o(N * F);
    reference::swiglu_forward<Mp>(N, F, o.data(), x.data());
    return weighted_sum(o, wl);
  }, x0, grad, mag, 16 + N * F, 43);
}

TEST(ReferenceGradient, EmbeddingMatchesMpfrFiniteDifferences) {
  const int64_t B = 2, T = 5, C = 6, V = 4;
  const std::vector<int32_t> tokens = {0, 3, 3, 1, 0, 2, 3, 0, 0, 1};
  const auto wl = random_mp(B * T * C, 51, -1.0f, 1.0f);
  const std::vector<Mp> x0 = random_mp(V * C + T * C, 52, -1.0f, 1.0f);  // [wte | wpe]
  std::vector<Mp> out(B * T * C), grad(x0.size(), Mp(0));
  reference::embedding_forward<Mp>(B, T, C, V, out.data(), tokens.data(), x0.data(), x0.data() + V * C);
  Mp mag;
  weighted_sum(out, wl, &mag);
  reference::embedding_backward<Mp>(B, T, C, V, grad.data(), grad.data() + V * C, wl.data(),
                                    tokens.data());
  check_directional("embedding", [&](const std::vector<Mp>& x) {
    std::vector<Mp> o(B * T * C);
    reference::embedding_forward<Mp>(B, T, C, V, o.data(), tokens.data(), x.data(), x.data() + V * C);
    return weighted_sum(o, wl);
  }, x0, grad, mag, 2 + B * T * C, 53);
}

// The router's backward with the balancing loss's gradient, for L = Σ gates·w + the mean over
// groups of the balancing loss (daux's scale: dloss = 1/N), the choice held at the unperturbed
// logits (top_k of distinct probabilities: a step of 2^-19 does not reorder them).
TEST(ReferenceGradient, RouterWithBalancingLossMatchesMpfrFiniteDifferences) {
  const int64_t N = 6, E = 5, K = 2, group = 3;
  const float weight = 0.5f, dloss = 1.0f / static_cast<float>(N);
  for (bool softmax : {true, false}) {
    for (bool normalize : {false, true}) {
      const reference::RouterDims s{N, E, K, softmax, normalize, group};
      const auto wl = random_mp(N * K, 51, -1.0f, 1.0f);
      const std::vector<Mp> x0 = random_mp(N * E, 52, -3.0f, 3.0f);
      std::vector<Mp> probs(N * E), gates(N * K);
      std::vector<int32_t> experts;
      {
        std::vector<int32_t> none(N * K, 0);
        reference::router_forward<Mp>(s, probs.data(), gates.data(), x0.data(), none.data());
        for (int64_t n = 0; n < N; ++n) {
          std::vector<float> p(E);
          for (int64_t e = 0; e < E; ++e) p[e] = probs[n * E + e].convert_to<float>();
          for (int32_t e : reference::top_k(p.data(), E, K)) experts.push_back(e);
        }
      }
      const auto loss = [&](const std::vector<Mp>& x, Mp* mag) {
        std::vector<Mp> p(N * E), g(N * K), aux(N / group), daux(N / group * E), mean(daux.size());
        reference::router_forward<Mp>(s, p.data(), g.data(), x.data(), experts.data());
        reference::moe_aux_loss<Mp>(s, weight, dloss, aux.data(), daux.data(), mean.data(), p.data(), experts.data());
        Mp total = weighted_sum(g, wl, mag);
        for (const Mp& a : aux) total += a * Mp(group) * Mp(dloss);
        return total;
      };
      Mp mag;
      loss(x0, &mag);
      std::vector<Mp> p(N * E), g(N * K), aux(N / group), daux(N / group * E), mean(daux.size()), grad(N * E);
      reference::router_forward<Mp>(s, p.data(), g.data(), x0.data(), experts.data());
      reference::moe_aux_loss<Mp>(s, weight, dloss, aux.data(), daux.data(), mean.data(), p.data(), experts.data());
      reference::router_backward<Mp>(s, grad.data(), p.data(), experts.data(), g.data(), wl.data(), daux.data());
      const std::string what = std::string("router ") + (softmax ? "softmax" : "sigmoid") +
                               (normalize ? " normalized" : "");
      check_directional(what, [&](const std::vector<Mp>& x) { return loss(x, nullptr); }, x0, grad, mag + 1, 16 + 4 * E,
                        53);
    }
  }
}

// Combine's backward: L = Σ w·out over the experts' rows y and the gates.
TEST(ReferenceGradient, MoeCombineMatchesMpfrFiniteDifferences) {
  struct {
    int64_t N, R, C, K;
  } const s{4, 6, 9, 2};
  const std::vector<int32_t> rows = {0, 3, 1, -1, 4, 2, 5, -1};  // two dropped choices
  const auto wl = random_mp(s.N * s.C, 61, -1.0f, 1.0f);
  const std::vector<Mp> x0 = random_mp(s.R * s.C + s.N * s.K, 62, -2.0f, 2.0f);
  const auto forward = [&](const std::vector<Mp>& x) {
    std::vector<Mp> out(s.N * s.C);
    reference::moe_combine_forward<Mp>(s.N, s.C, s.K, out.data(), x.data(), rows.data(), x.data() + s.R * s.C);
    return out;
  };
  Mp mag;
  weighted_sum(forward(x0), wl, &mag);
  std::vector<Mp> grad(x0.size(), Mp(0));
  reference::moe_combine_backward<Mp>(s.N, s.C, s.K, grad.data(), grad.data() + s.R * s.C, wl.data(), x0.data(), rows.data(),
                                      x0.data() + s.R * s.C);
  check_directional("moe combine", [&](const std::vector<Mp>& x) { return weighted_sum(forward(x), wl); }, x0, grad,
                    mag, 16 + s.C, 63);
}

}  // namespace
}  // namespace lockstep::test
