// Blockwise causal attention on the CPU (contract: kernels/ops/attention.hpp, "Blockwise"): a
// call's query rows against one key/value block, one pass of the online softmax at a time.
//
// A tile of 64 query rows [r0, r0 + 64) sees of a key block [k0, k1) the keys before the tile,
// [k0, min(k1, r0)), whole ("full"), and the tile's own 64 keys where the block holds them (the
// diagonal chunk), row t up to t: the visible keys of row t are the first nfull + (t − r0 + 1)
// columns of the tile, a prefix. The full part runs as packed products — the scores by
// matmul_canonical (each element canonical_dot), sums over keys by matmul_chunks_exact (each
// 64-key chunk's partial added exactly), sgemm in fast mode — and the diagonal as explicit chains
// over the visible keys only, so no masked entry enters a product and a non-finite operand needs
// no special path. The sums over the keys of a row (Z, D) run eight rows side by side.
// Threads take (b, h) pairs forward and (b, g) pairs backward (every query head of a group adds
// to the group's dk and dv), never part of a reduction: the bits do not depend on the threads.
// Per-thread tiles grow to the largest block seen and are kept.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_loops.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

constexpr int64_t kTile = kCanonicalChunk;

void check_call(AttentionShape s, QueryRows rows, const KeyBlock& keys, const BlockSoftmax& st, Mode mode,
                const char* op) {
  check_shape(s, op);
  const auto aligned = [&](int64_t first, int64_t count) {
    return first >= 0 && count > 0 && first + count <= s.T && first % kTile == 0 && count % kTile == 0;
  };
  LS_REQUIRE(s.T % kTile == 0 && aligned(rows.first, rows.count) && (keys.kv == nullptr || aligned(keys.first, keys.count)),
             op, ": T (", s.T, "), the query rows [", rows.first, ", ", rows.first + rows.count, ") and the keys [",
             keys.first, ", ", keys.first + keys.count, ") must lie on multiples of ", kTile);
  LS_REQUIRE(st.max != nullptr && st.denom != nullptr && (mode == Mode::kCanonical ? st.exact != nullptr : st.sums != nullptr),
             op, ": BlockSoftmax needs max, denom and ", mode == Mode::kCanonical ? "exact" : "sums");
  if (mode == Mode::kCanonical) {
    LS_REQUIRE(st.exact->size() >= static_cast<size_t>(s.B * s.NH * rows.count * s.HS), op,
               ": BlockSoftmax::exact holds ", st.exact->size(), " elements, fewer than B·NH·rows·HS = ",
               s.B * s.NH * rows.count * s.HS);
  }
}

// Where one (b, h) pair's data of a call lie.
struct Pair {
  Pair(AttentionShape s, QueryRows r, const KeyBlock& k, int64_t b, int64_t h)
      : HS(s.HS), W((s.NH + 2 * s.NKV) * s.HS), KVW(2 * s.NKV * s.HS), n(r.count), first(r.first), kf(k.first),
        kc(k.count), stat((b * s.NH + h) * r.count) {
    const int64_t g = h / (s.NH / s.NKV);
    q = b * n * W + h * HS;
    dout = (b * n * s.NH + h) * HS;
    dout_row = s.NH * HS;
    kv_k = b * kc * KVW + g * HS;
    kv_v = kv_k + s.NKV * HS;
    dk = k.at + (b * s.NKV + g) * kc * HS;
    dv = dk + s.B * s.NKV * kc * HS;
  }
  int64_t HS, W, KVW, n, first, kf, kc;
  int64_t stat;  // statistics of row `first`; row t at stat + t − first, its sums at (stat + t − first)·HS
  int64_t q, dout, dout_row, kv_k, kv_v, dk, dv;
};

// The keys tile [r0, r0 + 64) sees of the block: columns [0, full) seen by every row, then the
// diagonal chunk's 64 where the block holds it.
struct Seen {
  int64_t full = 0;
  bool diagonal = false;
  int64_t columns() const { return full + (diagonal ? kTile : 0); }
  int64_t of_row(int64_t i) const { return full + (diagonal ? i + 1 : 0); }  // row r0 + i
};
Seen seen(int64_t r0, int64_t kf, int64_t kc) {
  if (r0 < kf) return {};
  const bool diagonal = r0 < kf + kc;
  return {std::min(kf + kc, r0) - kf, diagonal};
}

// Per-thread tiles of 64 rows and a pair's rounded sums, grown as needed and kept.
struct Tiles {
  std::vector<float> a, b, chain, sums;
  void fit(int64_t columns, int64_t HS) {
    const auto n = static_cast<size_t>(kTile * columns);
    if (a.size() < n) a.resize(n), b.resize(n);
    if (chain.size() < static_cast<size_t>(HS)) chain.resize(static_cast<size_t>(HS));
  }
  float* sums_of(int64_t n) {
    if (sums.size() < static_cast<size_t>(n)) sums.resize(static_cast<size_t>(n));
    return sums.data();
  }
};
Tiles& thread_tiles() {
  thread_local Tiles tiles;
  return tiles;
}

// The scores of the tile: S[i, c] = (q[r0 + i]·k[kf + c])·scale for c < cols, ld = cols; canonical:
// canonical_dot, then one rounding by the scale, as the whole op.
void scores(Mode mode, const Pair& p, int64_t r0, int64_t cols, float scale, const float* q, const float* kv,
            float* S) {
  const float* qr = q + p.q + (r0 - p.first) * p.W;
  const float* k = kv + p.kv_k;
  if (mode == Mode::kCanonical) {
    matmul_canonical(kTile, cols, p.HS, S, cols, qr, p.W, 1, k, 1, p.KVW);
    for (int64_t x = 0; x < kTile * cols; ++x) S[x] = S[x] * scale;
    return;
  }
  sgemm_serial(false, true, kTile, cols, p.HS, scale, qr, p.W, k, p.KVW, 0.0f, S, cols);
}

// Σ over each of the tile's rows' visible keys of x (kDot: of x·y), x and y (64, cols) at ld cols,
// in the contract's chunks of 64 keys, each chunk's chain from +0 added to acc at at + row. The full
// chunks run eight rows side by side, each row's chain in one lane (simd::load_transposed8: the
// same links in the same order); the diagonal chunk's chains, of different lengths, one row at a
// time.
template <bool kDot>
void add_key_sums(const Seen& sn, const float* x, const float* y, int64_t ld, ExactAccumulator& acc, int64_t at) {
  alignas(32) float lane[8];
  for (int64_t r = 0; r < kTile; r += 8) {
    for (int64_t c0 = 0; c0 < sn.full; c0 += kCanonicalChunk) {
      simd::V8 chain = _mm256_setzero_ps();
      for (int64_t u = c0; u < c0 + kCanonicalChunk; u += 8) {
        simd::V8 xr[8], yr[8];
        simd::load_transposed8(x + r * ld + u, ld, xr);
        if constexpr (kDot) simd::load_transposed8(y + r * ld + u, ld, yr);
        for (int k = 0; k < 8; ++k) chain = kDot ? _mm256_fmadd_ps(xr[k], yr[k], chain) : _mm256_add_ps(chain, xr[k]);
      }
      _mm256_store_ps(lane, chain);
      for (int j = 0; j < 8; ++j) acc.add(static_cast<size_t>(at + r + j), lane[j]);
    }
  }
  if (!sn.diagonal) return;
  for (int64_t i = 0; i < kTile; ++i) {
    const float* xi = x + i * ld + sn.full;
    const float* yi = y + i * ld + sn.full;
    float chain = 0.0f;
    for (int64_t u = 0; u <= i; ++u) chain = kDot ? std::fma(xi[u], yi[u], chain) : chain + xi[u];
    acc.add(static_cast<size_t>(at + i), chain);
  }
}

// The probabilities of the tile from the statistics: S = exp(S − m) / Z over each row's prefix.
void probabilities(const Pair& p, const BlockSoftmax& st, int64_t r0, const Seen& sn, float* S) {
  const int64_t cols = sn.columns();
  for (int64_t i = 0; i < kTile; ++i) {
    const int64_t at = p.stat + r0 + i - p.first, n = sn.of_row(i);
    float* a = S + i * cols;
    exp_row(a, n, st.max[at]);
    const float z = st.denom[at];
    for (int64_t u = 0; u < n; ++u) a[u] = a[u] / z;
  }
}

// y[r] (+)= Σ_c W[r, c]·x[c] over the tile's keys for its rows r (W (64, cols) at ld cols, x's key
// rows at stride sx): the full columns as one product, then each row's diagonal keys up to itself.
// Canonical: every 64-key chunk's partial into `exact` at (at + r)·HS; fast: fp32 into y (row r at
// y + r·HS).
void rows_times_keys(Mode mode, const Pair& p, const Seen& sn, const float* W, const float* x, int64_t sx, int64_t r0,
                     ExactAccumulator* exact, int64_t at, float* y, float* chain) {
  const int64_t cols = sn.columns(), HS = p.HS;
  if (sn.full > 0) {
    if (mode == Mode::kCanonical) {
      matmul_chunks_exact(kTile, HS, sn.full, *exact, at * HS, W, cols, 1, x, sx, 1);
    } else {
      sgemm_serial(false, false, kTile, HS, sn.full, 1.0f, W, cols, x, sx, 1.0f, y, HS);
    }
  }
  if (!sn.diagonal) return;
  const float* xd = x + (r0 - p.kf) * sx;  // the diagonal keys' rows
  for (int64_t i = 0; i < kTile; ++i) {
    const float* w = W + i * cols + sn.full;
    if (mode == Mode::kCanonical) {
      std::fill(chain, chain + HS, 0.0f);
      for (int64_t u = 0; u <= i; ++u) fma_link(chain, w[u], xd + u * sx, HS);
      exact->add_run(static_cast<size_t>((at + i) * HS), chain, static_cast<size_t>(HS));
    } else {
      add_weighted_rows(y + i * HS, w, 1, xd, sx, i + 1, HS);
    }
  }
}

// dst[key] (+)= Σ_i W[i, key]·x[i] over the tile's rows for the tile's keys (the key gradients):
// the full keys from all 64 rows (one chunk of the contract's pairs), each diagonal key from the
// rows at or after it. Canonical: each key's chunk partial into grads.exact; fast: fp32 sums.
void keys_times_rows(Mode mode, const Pair& p, const Seen& sn, const float* W, const float* x, int64_t sx, int64_t r0,
                     const KeyGrads& grads, int64_t dst, float* chain) {
  const int64_t cols = sn.columns(), HS = p.HS;
  if (sn.full > 0) {
    if (mode == Mode::kCanonical) {
      matmul_chunks_exact(sn.full, HS, kTile, *grads.exact, dst, W, 1, cols, x, sx, 1);
    } else {
      sgemm_serial(true, false, sn.full, HS, kTile, 1.0f, W, cols, x, sx, 1.0f, grads.partial + dst, HS);
    }
  }
  if (!sn.diagonal) return;
  for (int64_t c = 0; c < kTile; ++c) {
    const int64_t key = dst + (r0 - p.kf + c) * HS;
    const float* w = W + c * cols + sn.full + c;  // row c, the key's column
    if (mode == Mode::kCanonical) {
      std::fill(chain, chain + HS, 0.0f);
      for (int64_t i = c; i < kTile; ++i) fma_link(chain, w[(i - c) * cols], x + i * sx, HS);
      grads.exact->add_run(static_cast<size_t>(key), chain, static_cast<size_t>(HS));
    } else {
      add_weighted_rows(grads.partial + key, w, cols, x + c * sx, sx, kTile - c, HS);
    }
  }
}

// f(r0, seen, tiles) for each tile [r0, r0 + 64) of the pair's rows that sees a key of the block,
// with the thread's tiles fitted to it and the tile's scores in tiles.a.
template <class F>
void for_each_tile(Mode mode, const Pair& p, const float* q, const float* kv, float scale, F&& f) {
  Tiles& tiles = thread_tiles();
  for (int64_t r0 = p.first; r0 < p.first + p.n; r0 += kTile) {
    const Seen sn = seen(r0, p.kf, p.kc);
    if (sn.columns() == 0) continue;
    tiles.fit(sn.columns(), p.HS);
    scores(mode, p, r0, sn.columns(), scale, q, kv, tiles.a.data());
    f(r0, sn, tiles);
  }
}

void forward_pair(Mode mode, BlockPass pass, const Pair& p, const BlockSoftmax& st, const float* q, const float* kv,
                  float scale) {
  for_each_tile(mode, p, q, kv, scale, [&](int64_t r0, const Seen& sn, Tiles& tiles) {
    const int64_t cols = sn.columns();
    float* S = tiles.a.data();
    const int64_t at0 = p.stat + r0 - p.first;
    if (pass == BlockPass::kMax) {
      for (int64_t i = 0; i < kTile; ++i) {
        const float m = simd::first_max(S + i * cols, sn.of_row(i));
        if (m > st.max[at0 + i]) st.max[at0 + i] = m;
      }
      return;
    }
    if (pass == BlockPass::kValues) {
      probabilities(p, st, r0, sn, S);
      rows_times_keys(mode, p, sn, S, kv + p.kv_v, p.KVW, r0, st.exact, at0, nullptr, tiles.chain.data());
      return;
    }
    // kSum
    for (int64_t i = 0; i < kTile; ++i) exp_row(S + i * cols, sn.of_row(i), st.max[at0 + i]);
    if (mode == Mode::kCanonical) {
      add_key_sums<false>(sn, S, S, cols, *st.exact, at0);
      return;
    }
    for (int64_t i = 0; i < kTile; ++i) {
      float z = 0.0f;
      for (int64_t u = 0; u < sn.of_row(i); ++u) z += S[i * cols + u];
      st.denom[at0 + i] += z;
    }
    rows_times_keys(mode, p, sn, S, kv + p.kv_v, p.KVW, r0, nullptr, 0, st.sums + at0 * p.HS, nullptr);
  });
}

void backward_pair(Mode mode, BlockPass pass, const Pair& p, const BlockSoftmax& st, const KeyGrads& grads,
                   const float* dout, const float* q, const float* kv, float scale) {
  for_each_tile(mode, p, q, kv, scale, [&](int64_t r0, const Seen& sn, Tiles& tiles) {
    const int64_t cols = sn.columns();
    float *A = tiles.a.data(), *dS = tiles.b.data();
    probabilities(p, st, r0, sn, A);
    // datt[i, c] = dout[r0 + i]·v[kf + c]   (forward: out = Σ att·v)
    const float* dy = dout + p.dout + (r0 - p.first) * p.dout_row;
    if (mode == Mode::kCanonical) {
      matmul_canonical(kTile, cols, p.HS, dS, cols, dy, p.dout_row, 1, kv + p.kv_v, 1, p.KVW);
    } else {
      sgemm_serial(false, true, kTile, cols, p.HS, 1.0f, dy, p.dout_row, kv + p.kv_v, p.KVW, 0.0f, dS, cols);
    }
    const int64_t at0 = p.stat + r0 - p.first;
    if (pass == BlockPass::kDelta) {
      // D[t] = Σ over the visible keys of att·datt
      if (mode == Mode::kCanonical) {
        add_key_sums<true>(sn, A, dS, cols, *st.exact, at0);
        return;
      }
      for (int64_t i = 0; i < kTile; ++i) st.delta[at0 + i] += dot_any_order(A + i * cols, dS + i * cols, sn.of_row(i));
      return;
    }
    // kGrads: ds = att·(datt − D)   (forward: att = exp(s − m) / Z)
    for (int64_t i = 0; i < kTile; ++i) {
      const float D = st.delta[at0 + i];
      const float* a = A + i * cols;
      float* ds = dS + i * cols;
      for (int64_t u = 0; u < sn.of_row(i); ++u) ds[u] = a[u] * (ds[u] - D);
    }
    float* chain = tiles.chain.data();
    // dq[t] = Σ ds·k (scaled at the end)   (forward: s = (q·k)·scale)
    rows_times_keys(mode, p, sn, dS, kv + p.kv_k, p.KVW, r0, st.exact, at0,
                    mode == Mode::kFast ? st.sums + at0 * p.HS : nullptr, chain);
    // dk[u] = Σ ds·q (unscaled), dv[u] = Σ att·dout   (forward: s = (q·k)·scale, out = Σ att·v)
    keys_times_rows(mode, p, sn, dS, q + p.q + (r0 - p.first) * p.W, p.W, r0, grads, p.dk, chain);
    keys_times_rows(mode, p, sn, A, dy, p.dout_row, r0, grads, p.dv, chain);
  });
}

}  // namespace

void attention_blocks_forward(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, KeyBlock keys,
                              BlockSoftmax stats, const float* q) {
  check_call(s, rows, keys, stats, mode, "attention_blocks_forward");
  LS_REQUIRE(pass == BlockPass::kMax || pass == BlockPass::kSum || (pass == BlockPass::kValues && mode == Mode::kCanonical),
             "attention_blocks_forward: the forward's passes are kMax, kSum and (canonical mode) kValues");
  const float scale = attention_scale(s.HS);
  BlasSerial serial;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) forward_pair(mode, pass, Pair(s, rows, keys, b, h), stats, q, keys.kv, scale);
  }
}

void attention_blocks_backward(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, KeyBlock keys,
                               BlockSoftmax stats, KeyGrads grads, const float* dout, const float* q) {
  check_call(s, rows, keys, stats, mode, "attention_blocks_backward");
  LS_REQUIRE(pass == BlockPass::kDelta || pass == BlockPass::kGrads,
             "attention_blocks_backward: the backward's passes are kDelta and kGrads");
  LS_REQUIRE(stats.delta != nullptr, "attention_blocks_backward: BlockSoftmax needs delta");
  LS_REQUIRE(pass == BlockPass::kDelta || (mode == Mode::kCanonical ? grads.exact != nullptr : grads.partial != nullptr),
             "attention_blocks_backward: kGrads needs KeyGrads::", mode == Mode::kCanonical ? "exact" : "partial");
  const float scale = attention_scale(s.HS);
  const int64_t group = s.NH / s.NKV;
  BlasSerial serial;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t g = 0; g < s.NKV; ++g) {
      for (int64_t j = 0; j < group; ++j) {
        backward_pair(mode, pass, Pair(s, rows, keys, b, g * group + j), stats, grads, dout, q, keys.kv, scale);
      }
    }
  }
}

void attention_blocks_end(Mode mode, AttentionShape s, BlockPass pass, QueryRows rows, BlockSoftmax st, float* out) {
  check_call(s, rows, {}, st, mode, "attention_blocks_end");
  const int64_t n = rows.count, HS = s.HS, stats = s.B * s.NH * n;
  const int64_t W = (s.NH + 2 * s.NKV) * HS, ldo = pass == BlockPass::kGrads ? W : s.NH * HS;
  const float factor = pass == BlockPass::kGrads ? attention_scale(HS) : 1.0f;
  if (pass == BlockPass::kSum && mode == Mode::kCanonical) {
    st.exact->round_to(0, static_cast<size_t>(stats), st.denom);
    st.exact->zero(0, static_cast<size_t>(stats));
    return;
  }
  if (pass == BlockPass::kDelta) {
    if (mode == Mode::kCanonical) {
      st.exact->round_to(0, static_cast<size_t>(stats), st.delta);
      st.exact->zero(0, static_cast<size_t>(stats));
    }
    return;
  }
  LS_REQUIRE(pass != BlockPass::kMax, "attention_blocks_end: kMax has no end");
  // The rows' outputs (out, or dq's q columns): a pair's exact sums rounded once (into its sums'
  // place in a per-thread row buffer), fast sums divided by Z.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t at = (b * s.NH + h) * n;
      const auto first = static_cast<size_t>(at * HS), end = static_cast<size_t>((at + n) * HS);
      float* sums = st.sums + at * HS;
      if (mode == Mode::kCanonical) {
        sums = thread_tiles().sums_of(n * HS);
        st.exact->round_to(first, end, sums);
        st.exact->zero(first, end);
      }
      for (int64_t t = 0; t < n; ++t) {
        float* dst = out + (b * n + t) * ldo + h * HS;
        float* row = sums + t * HS;
        for (int64_t d = 0; d < HS; ++d) {
          dst[d] = mode == Mode::kFast && pass != BlockPass::kGrads ? row[d] / st.denom[at + t] : row[d] * factor;
          row[d] = 0.0f;
        }
      }
    }
  }
}

}  // namespace lockstep::cpu
