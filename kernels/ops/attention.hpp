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
//
// Part of the queries (context parallelism: each rank holds some blocks of every sequence's
// positions): the _rows variants compute the rows t in [first, first + count) of each sequence
// only, each bit for bit as above, against the keys and values of [0, first + count). dk and dv of
// every key then sum only the pairs (j, t) with t in those rows: in canonical mode each chunk of
// the contract's chain lies inside one query block (T, first and count multiples of 64, so a chunk
// never spans two blocks), and the call adds its chunk partials to exact sums, which the caller
// combines over the blocks (the ranks) and rounds once; dk is left unscaled there, the caller
// multiplying by scale after rounding, as the whole op does. Fast mode gives fp32 partial sums.
//
// Blockwise (context parallelism's ring of key/value blocks): the _blocks ops compute the same
// query rows without the (rows, T) probabilities, against one block of keys at a time, in passes
// over every block the rows see; per (b, h, row) the caller keeps the statistics of the online
// softmax, BlockSoftmax, between calls and passes. Blocks may come in any order.
//   forward, canonical:  kMax     m = max of the block's scores (the running max; -inf first)
//                        kSum     Z's chunk partials of e = exp(s − m) into `exact`
//                        end      Z rounded once into `denom`
//                        kValues  out's chunk partials of (e / Z)·v into `exact`
//                        end      out rounded once
//   forward, fast:       kMax, then kSum: denom += Σ e and sums += Σ e·v (fp32); end: out = sums / denom
//   backward, canonical: kDelta   att recomputed from (m, Z): the same bits as the forward's;
//                                 datt = dout·v as above; D's chunk partials of att·datt into `exact`
//                        end      D rounded once into `delta`
//                        kGrads   ds = att·(datt − D); dq's chunk partials of ds·k into `exact`, and
//                                 the block's dk, dv chunk partials into KeyGrads, as the _rows op
//                        end      dq rounded once, then · scale
//   backward, fast:      the same passes with fp32 sums in `delta` and `sums`.
// Every chunk of a chain is the contract's (keys, rows, T multiples of 64), and exact sums do not
// depend on the order of their partials: the canonical results are the _rows op's bits, for any
// cut of the keys into blocks and any order of the blocks. The row max is the same value in any
// order but for the sign of a zero maximum, which no e = exp(s − m) can see. Fast mode: the
// blocks' sums in any order; out's division after the sum instead of before each term is within
// the same bound (Σ|e·v|/Z, one more rounding per term either way).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep {

struct AttentionShape {
  int64_t B, T, NH, NKV, HS;
};

// 1/sqrt(HS) rounded once to fp32 (sqrt and the division are correctly rounded in double, and
// the double -> float conversion rounds once more: the same value on every machine).
inline float attention_scale(int64_t HS) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS))); }

// The query rows of each sequence a _rows call computes: [first, first + count).
struct QueryRows {
  int64_t first = 0, count = 0;
};

// Where attention_backward_rows adds dk and dv (unscaled), laid out [dk | dv], each (B, NKV, T, HS):
// canonical mode its chunk partials to `exact`, fast mode its fp32 sums to `partial`.
struct KeyGrads {
  ExactAccumulator* exact = nullptr;
  float* partial = nullptr;
};

// A blockwise pass (the header's "Blockwise").
enum class BlockPass : uint8_t { kMax, kSum, kValues, kDelta, kGrads };

// The statistics of the query rows a _blocks call computes, kept by the caller across its calls:
// max, denom and delta (B, NH, rows); canonical mode's exact sums (Z and D at element (b, h, row),
// out and dq at ((b, h, row), d)) and fast mode's fp32 sums (B, NH, rows, HS), zero before a
// pass's first call (an end call leaves them zero). max starts at -inf; fast mode's denom and delta
// are running sums, zero before kSum and kDelta.
struct BlockSoftmax {
  float* max = nullptr;
  float* denom = nullptr;
  float* delta = nullptr;
  ExactAccumulator* exact = nullptr;
  float* sums = nullptr;
};

// A _blocks call's key/value block: keys [first, first + count) of each sequence, rows
// (B, count, 2·NKV·HS) laid out [k: NKV heads | v: NKV heads], and where its gradients go: [dk | dv],
// each (B, NKV, count, HS), from element `at` of the KeyGrads.
struct KeyBlock {
  int64_t first = 0, count = 0;
  const float* kv = nullptr;
  int64_t at = 0;
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

// The same for the query rows `rows` only (the header's "Part of the queries"); qkv holds every
// position's k and v, and q at those rows. scale_of gives the caller the scale dk is missing.
void attention_forward_rows(Mode mode, AttentionShape s, QueryRows rows,
                            float* out,                           // (B, rows, NH*HS)
                            float* att,                           // (B, NH, rows, T) cached
                            const float* qkv);                    // (B, T, (NH+2NKV)*HS)
void attention_backward_rows(Mode mode, AttentionShape s, QueryRows rows,
                             float* dq,                           // (B, rows, (NH+2NKV)*HS): q columns
                             KeyGrads keys,                       // dk, dv of every key
                             float* scratch,                      // (B, NH, rows, T) workspace
                             const float* dout,                   // (B, rows, NH*HS)
                             const float* qkv, const float* att);

// Blockwise: one pass (kMax, kSum, kValues forward; kDelta, kGrads backward) over one key block.
// q holds the rows' [q | k | v] (B, rows, (NH+2NKV)*HS) — only q is read; dout (B, rows, NH*HS).
void attention_blocks_forward(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, KeyBlock keys,
                              BlockSoftmax stats, const float* q);
void attention_blocks_backward(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, KeyBlock keys,
                               BlockSoftmax stats, KeyGrads grads, const float* dout, const float* q);
// The end of a pass over every block: kSum, kValues (forward: out (B, rows, NH*HS) when it is
// complete), kDelta, kGrads (backward: dq's q columns of (B, rows, (NH+2NKV)*HS)).
void attention_blocks_end(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, BlockSoftmax stats,
                          float* out);

}  // namespace lockstep::cpu
