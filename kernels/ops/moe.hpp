// Mixture-of-experts ops: the router's scores and choice, the auxiliary load-balancing loss, and
// moving tokens to their experts and back (dispatch, combine).
//
// Router (per token n of N, E experts, K chosen):
//   softmax  m = max_e logits[e] (NaN skipped, as crossentropy.hpp's max);
//            z[e] = ls_expf(logits[e] − m);  Z = canonical_sum over e of z;  probs[e] = z[e] / Z
//   sigmoid  probs[e] = 1 / (1 + ls_expf(−logits[e]))
//   experts[n, 0..K): the K largest selection scores, largest first; equal values go to the lower
//            index; NaN ranks below every number (and among NaN the lower index first): the choice
//            depends on the values alone, never on the order a machine compared them in. The
//            selection score is probs[e], or probs[e] + bias[e] (one fp32 add) with a bias (the
//            aux-loss-free balancing of DeepSeek-V3: it steers the choice, not the gates).
//   gates[n, j] = probs[experts[n, j]], or with `normalize` that divided by S = the fp32 chain
//            ((p_0 + p_1) + ...) over j of the chosen probs (Mixtral / Qwen's norm_topk_prob).
// Router backward, from dgates (N, K) and the auxiliary loss's daux (G, E) (may be nullptr):
//   dp[e] = 0; for each j:  dp[experts[n, j]] = dgates[n, j]    without normalize, or
//                           (dgates[n, j] − D) / S             with D = the fp32 FMA chain over j
//                                                               of dgates[n, j]·gates[n, j] from +0
//   then dp[e] = dp[e] + daux[n / group, e] for every e (when daux is given);
//   softmax  s = canonical_dot over e of probs[e]·dp[e];  dlogits[e] = probs[e]·(dp[e] − s)
//   sigmoid  dlogits[e] = dp[e]·(probs[e]·(1 − probs[e]))
// Auxiliary loss (Switch / GShard form), per group of `group` tokens (a sequence: the same groups
// whatever the micro-batches or ranks, so layouts do not change it), G = N / group:
//   P[g, e] = canonical_sum over the group's tokens of probs[., e] / group      (mean_probs)
//   f[g, e] = count[g, e] / (group·K), count = the group's tokens that chose e (before any drop)
//   loss[g] = (weight·E)·canonical_dot over e of f[g, e]·P[g, e]
//   daux[g, e] = ((weight·E)·f[g, e])·dloss      (f is a count: no gradient flows through it; with
//                dloss = 1 / the step's tokens this is the gradient of the mean over sequences)
// Dispatch and combine, over R rows of the experts' buffer (expert-major; src/model/moe_routing.hpp
// assigns them); rows[n, j] is the row of token n's j-th choice, −1 where the choice was dropped:
//   dispatch           out[r] = inp[token_of_row[r]]                                  (copies)
//   dispatch backward  dinp[n, c] += dout[rows[n, j], c] for j = 0..K−1 in order (fp32 adds)
//   combine            out[n, c] = the fp32 FMA chain over j (dropped skipped) from +0 of
//                      gates[n, j]·y[rows[n, j], c]: a token all of whose choices were dropped
//                      gets +0 (its residual passes through)
//   combine backward   dy[rows[n, j], c] = gates[n, j]·dout[n, c];
//                      dgates[n, j] = canonical_dot over c of dout[n, c]·y[rows[n, j], c]
//                      (0 for a dropped choice)
// Both modes compute these formulas in this order (the reductions are over E, K and C, short
// next to the experts' products): the same bits in fast and canonical mode.
#pragma once

#include <cstdint>

namespace lockstep {

enum class RouterScore : uint8_t { kSoftmax, kSigmoid };

struct RouterShape {
  int64_t N;  // tokens
  int64_t E;  // experts
  int64_t K;  // experts chosen per token
  RouterScore score = RouterScore::kSoftmax;
  bool normalize = false;  // gates divided by the sum of the chosen probs
  int64_t group = 0;       // tokens per auxiliary-loss group (daux's rows); 0: no daux
};

struct MoeRowsShape {
  int64_t N;  // tokens
  int64_t R;  // rows of the experts' buffer (tokens × choices kept)
  int64_t C;  // features
  int64_t K;  // choices per token
};

}  // namespace lockstep

namespace lockstep::cpu {

void router_forward(RouterShape s,
                    float* probs,                                 // (N, E)
                    int32_t* experts,                             // (N, K)
                    float* gates,                                 // (N, K)
                    const float* logits,                          // (N, E)
                    const float* bias);                           // (E) or nullptr

void router_backward(RouterShape s,
                     float* dlogits,                              // (N, E) overwritten
                     const float* probs, const int32_t* experts,  // (N, E) (N, K)
                     const float* gates, const float* dgates,     // (N, K) (N, K)
                     const float* daux);                          // (N / group, E) or nullptr

void moe_aux_loss(RouterShape s, float weight, float dloss,
                  float* loss,                                    // (N / group)
                  float* daux,                                    // (N / group, E)
                  float* mean_probs,                              // (N / group, E): P
                  const float* probs, const int32_t* experts);    // (N, E) (N, K)

void moe_dispatch(MoeRowsShape s,
                  float* out,                                     // (R, C)
                  const float* inp,                               // (N, C)
                  const int32_t* token_of_row);                   // (R)

void moe_dispatch_backward(MoeRowsShape s,
                           float* dinp,                           // (N, C) +=
                           const float* dout,                     // (R, C)
                           const int32_t* rows);                  // (N, K)

void moe_combine_forward(MoeRowsShape s,
                         float* out,                              // (N, C)
                         const float* y,                          // (R, C)
                         const int32_t* rows, const float* gates);  // (N, K) (N, K)

void moe_combine_backward(MoeRowsShape s,
                          float* dy,                              // (R, C) overwritten (kept rows)
                          float* dgates,                          // (N, K)
                          const float* dout, const float* y,      // (N, C) (R, C)
                          const int32_t* rows, const float* gates);  // (N, K) (N, K)

}  // namespace lockstep::cpu
