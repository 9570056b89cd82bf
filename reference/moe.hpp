// Reference mixture-of-experts ops, templated on the scalar type: kernels/ops/moe.hpp's formulas
// in plain loops. The router's choice is an input here (the kernel's `experts`): a Bounded
// probability cannot rank experts, so the reference takes the routing decisions the trainer took
// and checks the choice itself with top_k (the rule on the kernel's own fp32 probabilities).
// Not here: assigning rows to experts (src/model/moe_routing.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/bounded.hpp"
#include "reference/crossentropy.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

// kernels/ops/moe.hpp's RouterShape, in the reference's own terms.
struct RouterDims {
  int64_t N = 0, E = 0, K = 0;  // tokens, experts, chosen per token
  bool softmax = true;          // else sigmoid scores
  bool normalize = false;       // gates divided by the sum of the chosen probs
  int64_t group = 0;            // tokens per balancing-loss group
};

// The K experts the rule of kernels/ops/moe.hpp chooses from one token's fp32 selection scores.
inline std::vector<int32_t> top_k(const float* p, int64_t E, int64_t K) {
  const auto before = [&](int64_t a, int64_t b) {
    if (std::isnan(p[a]) || std::isnan(p[b])) return std::isnan(p[a]) == std::isnan(p[b]) ? a < b : !std::isnan(p[a]);
    return p[a] != p[b] ? p[a] > p[b] : a < b;
  };
  std::vector<int32_t> out;
  std::vector<bool> taken(static_cast<size_t>(E), false);
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[static_cast<size_t>(e)] && (best < 0 || before(e, best))) best = e;
    taken[static_cast<size_t>(best)] = true;
    out.push_back(static_cast<int32_t>(best));
  }
  return out;
}

// probs (N, E) from logits; gates (N, K) of the given experts.
template <class Real>
void router_forward(const RouterDims& s, Real* probs, Real* gates, const Real* logits, const int32_t* experts) {
  using std::exp;
  for (int64_t n = 0; n < s.N; ++n) {
    const Real* x = logits + n * s.E;
    Real* p = probs + n * s.E;
    if (s.softmax) {
      Real m = x[0];
      for (int64_t e = 1; e < s.E; ++e) m = crossentropy_max(m, x[e]);
      for (int64_t e = 0; e < s.E; ++e) p[e] = exp(x[e] - m);
      const Real Z = sum(p, 1, s.E);
      for (int64_t e = 0; e < s.E; ++e) p[e] = p[e] / Z;
    } else {
      for (int64_t e = 0; e < s.E; ++e) p[e] = Real(1) / (Real(1) + exp(-x[e]));
    }
    const int32_t* chosen = experts + n * s.K;
    Real S = Real(0);
    for (int64_t j = 0; j < s.K; ++j) S = S + p[chosen[j]];
    for (int64_t j = 0; j < s.K; ++j) gates[n * s.K + j] = s.normalize ? p[chosen[j]] / S : p[chosen[j]];
  }
}

template <class Real>
void router_backward(const RouterDims& s, Real* dlogits, const Real* probs, const int32_t* experts, const Real* gates,
                     const Real* dgates, const Real* daux) {
  using std::fma;
  for (int64_t n = 0; n < s.N; ++n) {
    const Real* p = probs + n * s.E;
    const int32_t* chosen = experts + n * s.K;
    const Real* g = gates + n * s.K;
    const Real* dg = dgates + n * s.K;
    std::vector<Real> dp(static_cast<size_t>(s.E), Real(0));
    if (s.normalize) {
      Real S = Real(0), D = Real(0);
      for (int64_t j = 0; j < s.K; ++j) S = S + p[chosen[j]];
      for (int64_t j = 0; j < s.K; ++j) D = fma(dg[j], g[j], D);
      for (int64_t j = 0; j < s.K; ++j) dp[chosen[j]] = (dg[j] - D) / S;
    } else {
      for (int64_t j = 0; j < s.K; ++j) dp[chosen[j]] = dg[j];
    }
    if (daux != nullptr) {
      for (int64_t e = 0; e < s.E; ++e) dp[e] = dp[e] + daux[(n / s.group) * s.E + e];
    }
    Real* dl = dlogits + n * s.E;
    if (s.softmax) {
      const Real d = dot(p, 1, dp.data(), 1, s.E);
      for (int64_t e = 0; e < s.E; ++e) dl[e] = p[e] * (dp[e] - d);
    } else {
      for (int64_t e = 0; e < s.E; ++e) dl[e] = dp[e] * (p[e] * (Real(1) - p[e]));
    }
  }
}

template <class Real>
void moe_aux_loss(const RouterDims& s, float weight, float dloss, Real* loss, Real* daux, Real* mean_probs,
                  const Real* probs, const int32_t* experts) {
  const Real scale = Real(weight) * Real(static_cast<float>(s.E));
  for (int64_t g = 0; g < s.N / s.group; ++g) {
    std::vector<Real> f(static_cast<size_t>(s.E));
    std::vector<int64_t> count(static_cast<size_t>(s.E), 0);
    Real* P = mean_probs + g * s.E;
    for (int64_t i = 0; i < s.group * s.K; ++i) ++count[static_cast<size_t>(experts[g * s.group * s.K + i])];
    for (int64_t e = 0; e < s.E; ++e) {
      f[e] = Real(static_cast<float>(count[e])) / Real(static_cast<float>(s.group * s.K));
      P[e] = sum(probs + g * s.group * s.E + e, s.E, s.group) / Real(static_cast<float>(s.group));
      daux[g * s.E + e] = (scale * f[e]) * Real(dloss);
    }
    loss[g] = scale * dot(f.data(), 1, P, 1, s.E);
  }
}

template <class Real>
void moe_dispatch_backward(int64_t N, int64_t C, int64_t K, Real* dinp, const Real* dout, const int32_t* rows) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = rows[n * K + j];
      if (r < 0) continue;
      for (int64_t c = 0; c < C; ++c) dinp[n * C + c] = dinp[n * C + c] + dout[r * C + c];
    }
  }
}

template <class Real>
void moe_combine_forward(int64_t N, int64_t C, int64_t K, Real* out, const Real* y, const int32_t* rows, const Real* gates) {
  using std::fma;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      Real acc = Real(0);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = rows[n * K + j];
        if (r >= 0) acc = fma(gates[n * K + j], y[r * C + c], acc);
      }
      out[n * C + c] = acc;
    }
  }
}

template <class Real>
void moe_combine_backward(int64_t N, int64_t C, int64_t K, Real* dy, Real* dgates, const Real* dout, const Real* y, const int32_t* rows,
                          const Real* gates) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = rows[n * K + j];
      if (r < 0) {
        dgates[n * K + j] = Real(0);
        continue;
      }
      for (int64_t c = 0; c < C; ++c) dy[r * C + c] = gates[n * K + j] * dout[n * C + c];
      dgates[n * K + j] = dot(dout + n * C, 1, y + r * C, 1, C);
    }
  }
}

}  // namespace lockstep::reference
