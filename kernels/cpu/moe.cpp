// The mixture-of-experts ops on the CPU (contract in kernels/ops/moe.hpp): the formulas in their
// scalar order, tokens over the OpenMP threads (each token's reductions stay in one thread, so the
// bits do not depend on the thread count).
#include <omp.h>

#include <cmath>
#include <limits>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/moe.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

// a ranks before b: larger first, NaN below every number, equal values by index.
bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) == std::isnan(b) ? ia < ib : !std::isnan(a);
  return a != b ? a > b : ia < ib;
}

void check_router(RouterShape s) {
  LS_REQUIRE(s.E >= 1 && s.K >= 1 && s.K <= s.E, "router: K (", s.K, ") must be in [1, E = ", s.E, "]");
  LS_REQUIRE(s.group == 0 || s.N % s.group == 0, "router: N (", s.N, ") is not a multiple of the group (", s.group, ")");
}

}  // namespace

void router_forward(RouterShape s, float* probs, int32_t* experts, float* gates, const float* logits,
                    const float* bias) {
  check_router(s);
  const int64_t E = s.E, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = logits + n * E;
    float* p = probs + n * E;
    if (s.score == RouterScore::kSoftmax) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t e = 0; e < E; ++e) m = x[e] > m ? x[e] : m;
      for (int64_t e = 0; e < E; ++e) p[e] = ls_expf(x[e] - m);
      const float Z = canonical_sum(p, 1, E);
      for (int64_t e = 0; e < E; ++e) p[e] = p[e] / Z;
    } else {
      for (int64_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + ls_expf(-x[e]));
    }
    int32_t* chosen = experts + n * K;
    const auto score = [&](int64_t e) { return bias != nullptr ? p[e] + bias[e] : p[e]; };
    // Selection of the K best by repeated scans: K is small, and a scan's order is the rule's.
    for (int64_t j = 0; j < K; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= chosen[i] == e;
        if (!taken && (best < 0 || ranks_before(score(e), e, score(best), best))) best = e;
      }
      chosen[j] = static_cast<int32_t>(best);
    }
    float* g = gates + n * K;
    float S = 0.0f;
    for (int64_t j = 0; j < K; ++j) S = S + p[chosen[j]];
    for (int64_t j = 0; j < K; ++j) g[j] = s.normalize ? p[chosen[j]] / S : p[chosen[j]];
  }
}

void router_backward(RouterShape s, float* dlogits, const float* probs, const int32_t* experts, const float* gates,
                     const float* dgates, const float* daux) {
  check_router(s);
  const int64_t E = s.E, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* p = probs + n * E;
    const int32_t* chosen = experts + n * K;
    const float* g = gates + n * K;
    const float* dg = dgates + n * K;
    float* dl = dlogits + n * E;  // dp first, then dlogits in place
    for (int64_t e = 0; e < E; ++e) dl[e] = 0.0f;
    if (s.normalize) {
      float S = 0.0f, D = 0.0f;
      for (int64_t j = 0; j < K; ++j) S = S + p[chosen[j]];
      for (int64_t j = 0; j < K; ++j) D = std::fma(dg[j], g[j], D);
      for (int64_t j = 0; j < K; ++j) dl[chosen[j]] = (dg[j] - D) / S;
    } else {
      for (int64_t j = 0; j < K; ++j) dl[chosen[j]] = dg[j];
    }
    if (daux != nullptr) {
      const float* a = daux + (n / s.group) * E;
      for (int64_t e = 0; e < E; ++e) dl[e] = dl[e] + a[e];
    }
    if (s.score == RouterScore::kSoftmax) {
      const float dot = canonical_dot(p, 1, dl, 1, E);
      for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e) dl[e] = dl[e] * (p[e] * (1.0f - p[e]));
    }
  }
}

void moe_aux_loss(RouterShape s, float weight, float dloss, float* loss, float* daux, float* mean_probs,
                  const float* probs, const int32_t* experts) {
  check_router(s);
  LS_REQUIRE(s.group >= 1, "moe_aux_loss: group must be >= 1");
  const int64_t E = s.E, K = s.K, G = s.N / s.group;
  const float scale = weight * static_cast<float>(E);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < G; ++g) {
    float* f = daux + g * E;  // f first, then daux in place
    float* P = mean_probs + g * E;
    for (int64_t e = 0; e < E; ++e) f[e] = 0.0f;
    const int32_t* chosen = experts + g * s.group * K;
    for (int64_t i = 0; i < s.group * K; ++i) f[chosen[i]] += 1.0f;  // counts: exact below 2^24
    for (int64_t e = 0; e < E; ++e) {
      f[e] = f[e] / static_cast<float>(s.group * K);
      P[e] = canonical_sum(probs + g * s.group * E + e, E, s.group) / static_cast<float>(s.group);
    }
    loss[g] = scale * canonical_dot(f, 1, P, 1, E);
    for (int64_t e = 0; e < E; ++e) f[e] = (scale * f[e]) * dloss;
  }
}

void moe_dispatch(MoeRowsShape s, float* out, const float* inp, const int32_t* token_of_row) {
  const int64_t C = s.C;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.R; ++r) {
    const float* src = inp + static_cast<int64_t>(token_of_row[r]) * C;
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = src[c];
  }
}

void moe_dispatch_backward(MoeRowsShape s, float* dinp, const float* dout, const int32_t* rows) {
  const int64_t C = s.C, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    float* d = dinp + n * C;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = rows[n * K + j];
      if (r < 0) continue;
      const float* src = dout + static_cast<int64_t>(r) * C;
      for (int64_t c = 0; c < C; ++c) d[c] = d[c] + src[c];
    }
  }
}

void moe_combine_forward(MoeRowsShape s, float* out, const float* y, const int32_t* rows, const float* gates) {
  const int64_t C = s.C, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    float* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = rows[n * K + j];
      if (r < 0) continue;
      const float g = gates[n * K + j];
      const float* src = y + static_cast<int64_t>(r) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = std::fma(g, src[c], o[c]);
    }
  }
}

void moe_combine_backward(MoeRowsShape s, float* dy, float* dgates, const float* dout, const float* y,
                          const int32_t* rows, const float* gates) {
  const int64_t C = s.C, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* d = dout + n * C;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = rows[n * K + j];
      if (r < 0) {
        dgates[n * K + j] = 0.0f;
        continue;
      }
      const float g = gates[n * K + j];
      float* dst = dy + static_cast<int64_t>(r) * C;
      for (int64_t c = 0; c < C; ++c) dst[c] = g * d[c];
      dgates[n * K + j] = canonical_dot(d, 1, y + static_cast<int64_t>(r) * C, 1, C);
    }
  }
}

}  // namespace lockstep::cpu
