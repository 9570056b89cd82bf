// Causal multi-head self-attention with grouped key/value heads.
//
// qkv rows hold [q: NH heads | k: NKV heads | v: NKV heads], each head HS wide. Query head h
// uses key/value head g = h / (NH / NKV). scale = 1/sqrt(HS), rounded once to fp32.
//
// Forward, per (b, h, t):
//   s[t']   = canonical_dot over HS of q[t]·k[t'] , then · scale         for t' <= t
//   m       = max_t' s[t'];  e[t'] = exp(s[t'] - m);  Z = canonical_sum over t' of e
//   att[t'] = e[t'] / Z (0 for t' > t);  out[t] = canonical_dot over t' in [0,t] of att[t']·v[t']
// Backward, per (b, h):
//   datt[t,t'] = canonical_dot over HS of dout[t]·v[t']
//   ds[t,t']   = att[t,t']·(datt[t,t'] - D[t]),   D[t] = canonical_dot over t' of att[t,t']·datt[t,t']
//   dq[t]      = (canonical_dot over t' <= t of ds[t,t']·k[t']) · scale
//   dk[t'], dv[t'] (per key/value head g): reductions over the pairs (j, t) — j the query head's
//   index inside g's group, t >= t' — in the order i = j·T + t, chunked by 64 over i: a chunk
//   is the set of pairs with equal ⌊i/64⌋ (i counted over all j·T + t, t in [0,T)); pairs with
//   t < t' are not links of the chain, so a chunk without any contributes a +0 partial:
//   dk[t'] = (Σ ds[t,t']·q[t]) · scale,  dv[t'] = Σ att[t,t']·dout[t]
// Canonical mode uses transcendental.hpp's exp. Fast mode may use any order and libm.
// dqkv is overwritten. Sequences are independent (no reduction crosses b), so these are not
// token reductions in the sense of linear.hpp.
#pragma once

#include <cstdint>

#include "kernels/ops/mode.hpp"

namespace lockstep {

struct AttentionShape {
  int64_t B, T, NH, NKV, HS;
};

}  // namespace lockstep

namespace lockstep::cpu {

void attention_forward(Mode mode, AttentionShape s,
                       float* out,                                // (B, T, NH*HS)
                       float* att,                                // (B, NH, T, T) cached
                       const float* qkv);                         // (B, T, (NH+2NKV)*HS)

void attention_backward(Mode mode, AttentionShape s,
                        float* dqkv,                              // (B, T, (NH+2NKV)*HS) overwritten
                        float* scratch,                           // (B, NH, T, T) workspace
                        const float* dout,                        // (B, T, NH*HS)
                        const float* qkv, const float* att);      // inputs of the forward

}  // namespace lockstep::cpu
