// Softmax cross-entropy on the CPU, fused with its backward, and forward only (contract in
// kernels/ops/crossentropy.hpp).
//
// Canonical: Z = canonical_sum over v of e[v] = ls_expf(logits[v] − m), computed chunk by chunk
// (the chain of a chunk adds the e[v] as they are made, which is exactly chunk_sum over the
// stored values), log from ls_logf. Fast: libm expf/logf and one fp32 chain over the row.
// Both: rows are independent and threads take whole rows, so no reduction is split.
// A NaN logit makes its row's loss and dlogits NaN (m skips it, but exp(NaN − m) poisons Z).
// The vocabulary-parallel pieces use the same chains and formulas on a slice of the row.
// Not here: the collectives between those pieces (src/parallel via the model's TpGroup).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

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

float row_max(const float* x, int64_t V) {
  float m = -INFINITY;
  for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
  return m;
}

// The chunk partials of Σ ls_expf(x[v] − m) over v in [0, V), each passed to add().
template <class Add>
void partition_chunks(const float* x, int64_t V, float m, Add add) {
  for (int64_t v0 = 0; v0 < V; v0 += kCanonicalChunk) {
    const int64_t v1 = std::min(v0 + kCanonicalChunk, V);
    float acc = 0.0f;
    for (int64_t v = v0; v < v1; ++v) acc = acc + ls_expf(x[v] - m);
    add(acc);
  }
}

// Z = canonical_sum over v of ls_expf(x[v] − m).
float canonical_partition(const float* x, int64_t V, float m) {
  ChunkCombiner comb;
  partition_chunks(x, V, m, [&](float partial) { comb.add(partial); });
  return comb.finish();
}

float plain_partition(const float* x, int64_t V, float m) {
  float Z = 0.0f;
  for (int64_t v = 0; v < V; ++v) Z += std::exp(x[v] - m);
  return Z;
}

// losses[n] = (m + log Z) − logits[y]; with dlogits, logits[v] becomes
// (exp(logits[v] − m) / Z − [v == y]) · dloss.
// The shard's dlogits row: (exp(x[v] − m) / Z − [v0 + v == y]) · dloss, read before written.
template <bool kCanonical>
void dlogits_row(float* d, const float* x, int64_t V, int64_t v0, int32_t y, float m, float Z, float dloss) {
  for (int64_t v = 0; v < V; ++v) {
    const float e = kCanonical ? ls_expf(x[v] - m) : std::exp(x[v] - m);
    const float indicator = v0 + v == y ? 1.0f : 0.0f;
    d[v] = (e / Z - indicator) * dloss;
  }
}

template <bool kCanonical>
void crossentropy_rows(CrossEntropyShape s, float dloss, float* losses, float* dlogits,
                       const float* logits, const int32_t* targets) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) {
    const float* x = logits + n * s.V;
    const int32_t y = targets[n];
    const float m = row_max(x, s.V);
    const float Z = kCanonical ? canonical_partition(x, s.V, m) : plain_partition(x, s.V, m);
    const float log_z = kCanonical ? ls_logf(Z) : std::log(Z);
    losses[n] = (m + log_z) - x[y];
    if (dlogits == nullptr) continue;
    // Differentiates losses[n] = (m + log Z) − logits[y], Z = Σ exp(logits[v] − m); in place, so
    // read x[v] before writing the same element.
    dlogits_row<kCanonical>(dlogits + n * s.V, x, s.V, 0, y, m, Z, dloss);
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
  for (int64_t n = 0; n < s.N; ++n) m[n] = row_max(logits + n * s.V, s.V);
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
      partition_chunks(x, s.V, m[n], [&](float partial) { Z.add(row, partial); });
    } else {
      Z.add(row, plain_partition(x, s.V, m[n]));
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
    if (canonical) {
      dlogits_row<true>(dlogits + n * s.V, logits + n * s.V, s.V, s.v0, targets[n], m[n], Z[n], dloss);
    } else {
      dlogits_row<false>(dlogits + n * s.V, logits + n * s.V, s.V, s.v0, targets[n], m[n], Z[n], dloss);
    }
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
