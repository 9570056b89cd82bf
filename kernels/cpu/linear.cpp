// Linear layer on the CPU (kernels/ops/linear.hpp): fast mode through OpenBLAS sgemm split over the
// OpenMP threads (sgemm_threads.hpp), canonical mode through the canonical matrix products of
// matmul.hpp.
// Not here: the GEMM kernels themselves (matmul.isa.cpp), the collectives that combine tensor-
// parallel partials (src/parallel).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/linear.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

void check_shape(LinearShape s) {
  LS_CHECK(s.N >= 0 && s.IC >= 0 && s.OC >= 0, "linear: N=", s.N, " IC=", s.IC, " OC=", s.OC);
}

// A sink must match the mode: fp32 gradients in fast mode, the exact accumulator in canonical.
void check_sink(Mode mode, const GradSink& g, const char* what) {
  if (g.empty()) return;
  if (mode == Mode::kFast) {
    LS_CHECK(g.f32 != nullptr, "linear_backward(fast): ", what, " needs an fp32 gradient");
  } else {
    LS_CHECK(g.exact != nullptr, "linear_backward(canonical): ", what,
             " needs an exact accumulator");
  }
}

// dbias[o] += Σ_n dout[n,o] in chunks of kCanonicalChunk tokens: per chunk one fp32 addition
// chain per column in token order (the columns advance side by side, each chain unchanged), each
// chunk partial added exactly.
void bias_grad_canonical(LinearShape s, const GradSink& dbias, const float* dout) {
  constexpr int64_t kColumns = 256;  // columns per thread-local block of chains
  const int64_t blocks = (s.OC + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (s.N * s.OC > (int64_t{1} << 16))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t o0 = blk * kColumns;
    const int64_t width = std::min(kColumns, s.OC - o0);
    float partial[kColumns];
    for (int64_t n0 = 0; n0 < s.N; n0 += kCanonicalChunk) {
      const int64_t len = std::min(kCanonicalChunk, s.N - n0);
      std::fill(partial, partial + width, 0.0f);
      for (int64_t n = n0; n < n0 + len; ++n) {
        const float* row = dout + n * s.OC + o0;
        for (int64_t o = 0; o < width; ++o) partial[o] = partial[o] + row[o];
      }
      dbias.exact->add_run(static_cast<size_t>(dbias.offset + o0), partial, static_cast<size_t>(width));
    }
  }
}

}  // namespace

void linear_forward(Mode mode, LinearShape s, float* out, const float* inp, const float* weight,
                    const float* bias) {
  check_shape(s);
  if (s.N == 0 || s.OC == 0) return;
  if (mode == Mode::kCanonical) {
    // out[n,o] = canonical_dot_i(inp[n,i], weight[o,i]) + bias[o]: B[i,o] = weight[o,i].
    MatmulEpilogue ep;
    ep.col_bias = bias;
    ep.round_bf16 = s.round_outputs;
    matmul_canonical(s.N, s.OC, s.IC, out, s.OC, inp, s.IC, 1, weight, 1, s.IC, ep, s.operands);
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < s.N; ++n) std::copy(bias, bias + s.OC, out + n * s.OC);
    beta = 1.0f;
  }
  sgemm_threads(false, true, s.N, s.OC, s.IC, 1.0f, inp, s.IC, weight, s.IC, beta, out, s.OC, s.operands,
                s.round_outputs);
}

void linear_backward(Mode mode, LinearShape s, int64_t token_offset, float* dinp,
                     GradSink dweight, GradSink dbias, const float* dout, const float* inp,
                     const float* weight) {
  check_shape(s);
  check_sink(mode, dweight, "dweight");
  check_sink(mode, dbias, "dbias");
  if (mode == Mode::kCanonical) {
    LS_CHECK(token_offset >= 0 && token_offset % kCanonicalChunk == 0,
             "linear_backward(canonical): token_offset ", token_offset,
             " must be a multiple of the canonical chunk (", kCanonicalChunk,
             "): a split of the token range may not cut a chunk");
    // forward: out = inp · weightᵀ + bias
    // dinp[n,i] = canonical_dot_o(dout[n,o], weight[o,i])
    if (dinp != nullptr && s.N > 0 && s.IC > 0) {
      MatmulEpilogue ep;
      ep.round_bf16 = s.round_outputs;
      matmul_canonical(s.N, s.IC, s.OC, dinp, s.IC, dout, s.OC, 1, weight, s.IC, 1, ep, s.operands);
    }
    // dweight[o,i] += Σ_n dout[n,o]·inp[n,i]: A = doutᵀ, K = tokens.
    if (!dweight.empty()) {
      matmul_chunks_exact(s.OC, s.IC, s.N, *dweight.exact, dweight.offset, dout, 1, s.OC, inp,
                          s.IC, 1, s.operands);
    }
    if (!dbias.empty()) bias_grad_canonical(s, dbias, dout);
    return;
  }
  if (dinp != nullptr && s.N > 0 && s.IC > 0) {
    sgemm_threads(false, false, s.N, s.IC, s.OC, 1.0f, dout, s.OC, weight, s.IC, 0.0f, dinp, s.IC, s.operands,
                  s.round_outputs);
  }
  if (!dweight.empty() && s.OC > 0 && s.IC > 0) {
    sgemm_threads(true, false, s.OC, s.IC, s.N, 1.0f, dout, s.OC, inp, s.IC, 1.0f, dweight.f32, s.IC,
                  s.operands);
  }
  if (!dbias.empty()) {
    // Threads take blocks of columns; every element still adds the tokens in order, onto its
    // running sum held in registers for a whole block of 64 (through dbias, which may alias dout
    // as far as the compiler knows, each addition was a scalar load and store).
    constexpr int64_t kColumns = 64, kVectors = kColumns / 8;
#pragma omp parallel for schedule(static) if (s.N * s.OC > (int64_t{1} << 16))
    for (int64_t o0 = 0; o0 < s.OC; o0 += kColumns) {
      const int64_t o1 = std::min(o0 + kColumns, s.OC);
      float* db = dbias.f32;
      if (o1 - o0 == kColumns) {
        __m256 acc[kVectors];
        for (int64_t v = 0; v < kVectors; ++v) acc[v] = _mm256_loadu_ps(db + o0 + 8 * v);
        for (int64_t n = 0; n < s.N; ++n) {
          const float* row = dout + n * s.OC + o0;
          for (int64_t v = 0; v < kVectors; ++v) acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(row + 8 * v));
        }
        for (int64_t v = 0; v < kVectors; ++v) _mm256_storeu_ps(db + o0 + 8 * v, acc[v]);
        continue;
      }
      for (int64_t n = 0; n < s.N; ++n) {
        const float* row = dout + n * s.OC;
        for (int64_t o = o0; o < o1; ++o) db[o] += row[o];
      }
    }
  }
}

void linear_forward_partials(LinearShape s, ExactAccumulator& out, const float* inp,
                             const float* weight) {
  check_shape(s);
  LS_CHECK(!s.round_outputs, "linear_forward_partials: partial sums take no rounding to bf16");
  // out[n,o] = Σ_i inp[n,i]·weight[o,i]: B[i,o] = weight[o,i].
  matmul_chunks_exact(s.N, s.OC, s.IC, out, 0, inp, s.IC, 1, weight, 1, s.IC, s.operands);
}

void linear_backward_dinp_partials(LinearShape s, ExactAccumulator& dinp, const float* dout,
                                   const float* weight) {
  check_shape(s);
  LS_CHECK(!s.round_outputs, "linear_backward_dinp_partials: partial sums take no rounding to bf16");
  // forward: out = inp · weightᵀ  ->  dinp[n,i] = Σ_o dout[n,o]·weight[o,i]
  matmul_chunks_exact(s.N, s.IC, s.OC, dinp, 0, dout, s.OC, 1, weight, s.IC, 1, s.operands);
}

}  // namespace lockstep::cpu
