// Softmax cross-entropy on the CPU, fused with its backward, and forward only (contract in
// kernels/ops/crossentropy.hpp).
//
// Both modes evaluate every exp(x − m) with ls_expf, eight at a time (simd_math.hpp's expf8, the
// scalar function's bits; the scalar code does the tail): libm's expf does not vectorise and was
// the largest non-GEMM cost of a training step. Canonical: Z = canonical_sum over v of the e[v],
// computed chunk by chunk (a chunk's exps are made eight at a time into a buffer, then added in
// index order by one fp32 chain: exactly chunk_sum over the stored values; eight chunks' chains
// run side by side in the lanes of a vector), log from ls_logf.
// Fast: Z in sixteen lanes of fp32 partial sums (any order is within the fast bound), libm's logf.
// dlogits[v] = (e[v] / Z − [v == y])·dloss is elementwise in both modes: the vector code computes
// (e[v] / Z)·dloss, which is the formula's value wherever v ≠ y (subtracting +0 changes nothing,
// e[v] / Z being ≥ +0 or NaN), and the target's element is written afterwards by the scalar formula.
// The fused forward+backward keeps every e[v] in dlogits while it sums Z (one exp per logit); the
// vocabulary-parallel finish, which gets Z from the other ranks, computes them again.
// Both: rows are independent and threads take whole rows, so no reduction is split.
// A NaN logit makes its row's loss and dlogits NaN (m skips it, but exp(NaN − m) poisons Z).
// The vocabulary-parallel pieces use the same chains and formulas on a slice of the row.
// Not here: the collectives between those pieces (src/parallel/tp_plan.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/simd_math.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/transcendental.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

void check_inputs(CrossEntropyShape s, const int32_t* targets, const char* op) {
  LS_REQUIRE(s.N >= 0 && s.V > 0, op, ": N must be >= 0 and V > 0 (got N=", s.N, " V=", s.V, ")");
  for (int64_t n = 0; n < s.N; ++n) {
    LS_REQUIRE(targets[n] >= 0 && targets[n] < s.V, op, ": target of row ", n, " is ", targets[n],
               ", outside the vocabulary [0, ", s.V, ")");
  }
}

// e[i] = ls_expf(x[i] − m) for i in [0, n).
void exp_shifted(const float* x, int64_t n, float m, float* e) {
  const simd::V8 mv = simd::set1(m);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
  for (; i < n; ++i) e[i] = ls_expf(x[i] - m);
}

// The chunk partials of Σ ls_expf(x[v] − m) over v in [0, V), each passed to add() in chunk
// order; the exps are kept in keep[v] when keep is given (it may be x: each element is read before
// it is written). Eight whole chunks at a time have their exps made into keep (or a buffer) and
// their chains run side by side, one per lane (simd::load_transposed8): the same additions in the
// same order as one chain per chunk.
template <class Add>
void partition_chunks(const float* x, int64_t V, float m, float* keep, Add add) {
  constexpr int64_t kGroup = 8 * kCanonicalChunk;
  alignas(32) float buf[kGroup];
  int64_t v0 = 0;
  for (; v0 + kGroup <= V; v0 += kGroup) {
    float* e = keep != nullptr ? keep + v0 : buf;
    for (int64_t i = 0; i < kGroup; i += 8) {
      _mm256_storeu_ps(e + i, simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(x + v0 + i), simd::set1(m))));
    }
    simd::V8 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < kCanonicalChunk; i += 8) {
      simd::V8 r[8];
      simd::load_transposed8(e + i, kCanonicalChunk, r);
      for (const simd::V8& t : r) acc = _mm256_add_ps(acc, t);
    }
    alignas(32) float partial[8];
    _mm256_store_ps(partial, acc);
    for (float p : partial) add(p);
  }
  for (; v0 < V; v0 += kCanonicalChunk) {
    const int64_t len = std::min(kCanonicalChunk, V - v0);
    float* e = keep != nullptr ? keep + v0 : buf;
    exp_shifted(x + v0, len, m, e);
    float acc = 0.0f;
    for (int64_t i = 0; i < len; ++i) acc = acc + e[i];
    add(acc);
  }
}

// Z = canonical_sum over v of ls_expf(x[v] − m); the exps kept as in partition_chunks.
float canonical_partition(const float* x, int64_t V, float m, float* keep) {
  ChunkCombiner comb;
  partition_chunks(x, V, m, keep, [&](float partial) { comb.add(partial); });
  return comb.finish();
}

// Z = Σ ls_expf(x[v] − m) in sixteen fp32 lanes (two vectors, so that two exps are in flight); the
// exps kept as in partition_chunks.
float plain_partition(const float* x, int64_t V, float m, float* keep) {
  const simd::V8 mv = simd::set1(m);
  simd::V8 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();
  int64_t v = 0;
  for (; v + 16 <= V; v += 16) {
    const simd::V8 e0 = simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(x + v), mv));
    const simd::V8 e1 = simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(x + v + 8), mv));
    if (keep != nullptr) {
      _mm256_storeu_ps(keep + v, e0);
      _mm256_storeu_ps(keep + v + 8, e1);
    }
    z0 = _mm256_add_ps(z0, e0);
    z1 = _mm256_add_ps(z1, e1);
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, _mm256_add_ps(z0, z1));
  float Z = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; v < V; ++v) {
    const float e = ls_expf(x[v] - m);
    if (keep != nullptr) keep[v] = e;
    Z += e;
  }
  return Z;
}

// A whole row's dlogits from its exps, kept in d by the partition: d[v] = (e[v] / Z − [v == y])·dloss,
// the operations of dlogits_row on the same exps.
void dlogits_from_exps(float* d, int64_t V, int32_t y, float Z, float dloss) {
  const float e_target = d[y];
  const simd::V8 zv = simd::set1(Z), dv = simd::set1(dloss);
  int64_t v = 0;
  for (; v + 8 <= V; v += 8) _mm256_storeu_ps(d + v, _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(d + v), zv), dv));
  for (; v < V; ++v) d[v] = (d[v] / Z) * dloss;
  d[y] = (e_target / Z - 1.0f) * dloss;
}

// The shard's dlogits row: (exp(x[v] − m) / Z − [v0 + v == y]) · dloss, in place (x may be d):
// the target's logit is read before the row is overwritten (see the file header).
void dlogits_row(float* d, const float* x, int64_t V, int64_t v0, int32_t y, float m, float Z, float dloss) {
  const int64_t yl = y - v0;
  const bool owns_target = yl >= 0 && yl < V;
  const float x_target = owns_target ? x[yl] : 0.0f;
  const simd::V8 mv = simd::set1(m), zv = simd::set1(Z), dv = simd::set1(dloss);
  int64_t v = 0;
  for (; v + 8 <= V; v += 8) {
    const simd::V8 e = simd::expf8(_mm256_sub_ps(_mm256_loadu_ps(x + v), mv));
    _mm256_storeu_ps(d + v, _mm256_mul_ps(_mm256_div_ps(e, zv), dv));
  }
  for (; v < V; ++v) d[v] = (ls_expf(x[v] - m) / Z) * dloss;
  if (owns_target) d[yl] = (ls_expf(x_target - m) / Z - 1.0f) * dloss;
}

template <bool kCanonical>
void crossentropy_rows(CrossEntropyShape s, float dloss, float* losses, float* dlogits,
                       const float* logits, const int32_t* targets) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = logits + n * s.V;
    const int32_t y = targets[n];
    const float m = simd::first_max(x, s.V);
    // With dlogits (in place over the logits) the partition keeps every exp there, read once more
    // to differentiate losses[n] = (m + log Z) − logits[y]; logits[y] is read before.
    const float x_target = x[y];
    float* keep = dlogits != nullptr ? dlogits + n * s.V : nullptr;
    const float Z = kCanonical ? canonical_partition(x, s.V, m, keep) : plain_partition(x, s.V, m, keep);
    const float log_z = kCanonical ? ls_logf(Z) : std::log(Z);
    losses[n] = (m + log_z) - x_target;
    if (keep != nullptr) dlogits_from_exps(keep, s.V, y, Z, dloss);
  }
}

void check_shard(CrossEntropyShard s, const int32_t* targets, const char* op) {
  LS_REQUIRE(s.N >= 0 && s.V > 0 && s.v0 >= 0 && s.v0 + s.V <= s.V_total, op, ": shard [", s.v0, ", ",
             s.v0 + s.V, ") of a vocabulary of ", s.V_total, " for ", s.N, " rows");
  if (targets == nullptr) return;
  check_inputs({s.N, s.V_total}, targets, op);
}

}  // namespace

void crossentropy_shard_max(CrossEntropyShard s, float* m, const float* logits) {
  check_shard(s, nullptr, "crossentropy_shard_max");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) m[n] = simd::first_max(logits + n * s.V, s.V);
}

void crossentropy_shard_partition(Mode mode, CrossEntropyShard s, ExactAccumulator& Z, float* target,
                                  const float* logits, const float* m, const int32_t* targets) {
  check_shard(s, targets, "crossentropy_shard_partition");
  LS_CHECK(mode != Mode::kCanonical || s.v0 % kCanonicalChunk == 0, "crossentropy_shard_partition: shard start ",
           s.v0, " is not on a canonical chunk boundary");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = logits + n * s.V;
    const auto row = static_cast<size_t>(n);
    if (mode == Mode::kCanonical) {
      partition_chunks(x, s.V, m[n], nullptr, [&](float partial) { Z.add(row, partial); });
    } else {
      Z.add(row, plain_partition(x, s.V, m[n], nullptr));
    }
    const int64_t y = targets[n] - s.v0;
    target[n] = y >= 0 && y < s.V ? x[y] : -0.0f;
  }
}

void crossentropy_shard_finish(Mode mode, CrossEntropyShard s, float dloss, float* losses, float* dlogits,
                               const float* logits, const float* m, const float* Z, const float* target,
                               const int32_t* targets) {
  check_shard(s, targets, "crossentropy_shard_finish");
  const bool canonical = mode == Mode::kCanonical;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float log_z = canonical ? ls_logf(Z[n]) : std::log(Z[n]);
    losses[n] = (m[n] + log_z) - target[n];
    if (dlogits == nullptr) continue;
    dlogits_row(dlogits + n * s.V, logits + n * s.V, s.V, s.v0, targets[n], m[n], Z[n], dloss);
  }
}

void crossentropy_forward_backward(Mode mode, CrossEntropyShape s, float dloss, float* losses,
                                   float* logits, const int32_t* targets) {
  check_inputs(s, targets, "crossentropy_forward_backward");
  if (mode == Mode::kCanonical) {
    crossentropy_rows<true>(s, dloss, losses, logits, logits, targets);
  } else {
    crossentropy_rows<false>(s, dloss, losses, logits, logits, targets);
  }
}

void crossentropy_forward(Mode mode, CrossEntropyShape s, float* losses, const float* logits,
                          const int32_t* targets) {
  check_inputs(s, targets, "crossentropy_forward");
  if (mode == Mode::kCanonical) {
    crossentropy_rows<true>(s, 0.0f, losses, nullptr, logits, targets);
  } else {
    crossentropy_rows<false>(s, 0.0f, losses, nullptr, logits, targets);
  }
}

}  // namespace lockstep::cpu
