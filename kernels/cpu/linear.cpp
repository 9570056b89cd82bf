// Linear layer on the CPU (kernels/ops/linear.hpp): fast mode through OpenBLAS sgemm split over the
// OpenMP threads (sgemm_threads.hpp), canonical mode through the canonical matrix products of
// matmul.hpp; products under the emulated FP8 accumulator through matmul_fp8_accumulation.hpp in
// both modes.
// Not here: the GEMM kernels themselves (matmul.isa.cpp), the collectives that combine tensor-
// parallel partials (src/parallel).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/bf16_bits.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/matmul_fp8_accumulation.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/cast.hpp"
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

// dbias[o] += Σ_n dout[n,o] in fp32, token by token; each dout rounded to bf16 first where kRound.
template <bool kRound>
void bias_grad_fast(LinearShape s, float* db, const float* dout) {
  // Threads take blocks of columns; every element still adds the tokens in order, onto its
  // running sum held in registers for a whole block of 64 (through dbias, which may alias dout
  // as far as the compiler knows, each addition would be a scalar load and store).
  constexpr int64_t kColumns = 64, kVectors = kColumns / 8;
  const auto load = [](const float* p) {
    const __m256 v = _mm256_loadu_ps(p);
    return kRound ? bf16_nearest8(v) : v;
  };
#pragma omp parallel for schedule(static) if (s.N * s.OC > (int64_t{1} << 16))
  for (int64_t o0 = 0; o0 < s.OC; o0 += kColumns) {
    const int64_t o1 = std::min(o0 + kColumns, s.OC);
    if (o1 - o0 == kColumns) {
      __m256 acc[kVectors];
      for (int64_t v = 0; v < kVectors; ++v) acc[v] = _mm256_loadu_ps(db + o0 + 8 * v);
      for (int64_t n = 0; n < s.N; ++n) {
        const float* row = dout + n * s.OC + o0;
        for (int64_t v = 0; v < kVectors; ++v) acc[v] = _mm256_add_ps(acc[v], load(row + 8 * v));
      }
      for (int64_t v = 0; v < kVectors; ++v) _mm256_storeu_ps(db + o0 + 8 * v, acc[v]);
      continue;
    }
    for (int64_t n = 0; n < s.N; ++n) {
      const float* row = dout + n * s.OC;
      for (int64_t o = o0; o < o1; ++o) db[o] += kRound ? bf16_nearest(row[o]) : row[o];
    }
  }
}

// round_to_bf16 of n floats of x in this thread's copy for `Operand`, grown to the largest seen and
// kept (no allocation once the step has run); one copy per operand, as an op may read both.
template <class Operand>
const float* rounded_copy(int64_t n, const float* x) {
  thread_local std::vector<float> copy;
  if (copy.size() < static_cast<size_t>(n)) copy.resize(static_cast<size_t>(n));
  round_to_bf16(n, copy.data(), x);
  return copy.data();
}
struct Dout;    // rounded_copy's copy of an output gradient
struct Weight;  // and of a weight

// The operands as the contract reads them: dout and weight rounded into copies where asked and the
// products do not round them as read. (A forward passes no dout.)
struct ReadOperands {
  const float* dout;
  const float* weight;
  RoundAsPacked rounds;  // of the fast products' A = dout and B = weight
};
ReadOperands read_operands(Mode mode, LinearShape s, const float* dout, const float* weight) {
  if (linear_rounds_as_read(mode, s.operands, s.accumulation)) {
    return {dout, weight, {.a = s.round_dout, .b = s.round_weight}};
  }
  if (s.round_dout && dout != nullptr) dout = rounded_copy<Dout>(s.N * s.OC, dout);
  if (s.round_weight) weight = rounded_copy<Weight>(s.OC * s.IC, weight);
  return {dout, weight, {}};
}

// dinp and dweight of linear_backward under the emulated FP8 accumulator.
void hopper_backward(Mode mode, LinearShape s, float* dinp, const GradSink& dweight, const float* dout,
                     const float* inp, const float* weight) {
  // dinp[n,i] = Σ_o dout[n,o]·weight[o,i]
  if (dinp != nullptr && s.N > 0 && s.IC > 0) {
    matmul_fp8_hopper(mode, s.N, s.IC, s.OC, dout, s.OC, 1, weight, s.IC, 1,
                      {.f32 = dinp, .ldc = s.IC, .round_bf16 = s.round_outputs});
  }
  // dweight[o,i] += Σ_n dout[n,o]·inp[n,i]
  if (!dweight.empty() && s.OC > 0 && s.IC > 0) {
    const Fp8HopperOutput out = mode == Mode::kCanonical
                                    ? Fp8HopperOutput{.exact = dweight.exact, .offset = dweight.offset}
                                    : Fp8HopperOutput{.f32 = dweight.f32, .ldc = s.IC, .onto = true};
    matmul_fp8_hopper(mode, s.OC, s.IC, s.N, dout, 1, s.OC, inp, s.IC, 1, out);
  }
}

// out[n,o] (+)= Σ_i inp[n,i]·weight[o,i] under the emulated FP8 accumulator: B[i,o] = weight[o,i].
void hopper_forward(Mode mode, LinearShape s, const float* inp, const float* weight, const Fp8HopperOutput& out) {
  matmul_fp8_hopper(mode, s.N, s.OC, s.IC, inp, s.IC, 1, weight, 1, s.IC, out);
}

}  // namespace

// Fast mode's products on the VDPBF16PS build round their operands as they pack them
// (matmul_fast's RoundAsPacked), and the bias gradient rounds dout as it adds.
bool linear_rounds_as_read(Mode mode, Operands operands, Accumulation accumulation) {
  return mode == Mode::kFast && accumulation == Accumulation::kFp32 && matmul_fast_rounds_as_packed(operands);
}

void linear_forward(Mode mode, LinearShape s, float* out, const float* inp, const float* weight,
                    const float* bias) {
  check_shape(s);
  if (s.N == 0 || s.OC == 0) return;
  const ReadOperands r = read_operands(mode, s, nullptr, weight);
  weight = r.weight;
  if (s.accumulation == Accumulation::kHopperFp8) {
    hopper_forward(mode, s, inp, weight, {.f32 = out, .ldc = s.OC, .col_bias = bias, .round_bf16 = s.round_outputs});
    return;
  }
  if (mode == Mode::kCanonical) {
    // out[n,o] = canonical_dot_i(inp[n,i], weight[o,i]) + bias[o]: B[i,o] = weight[o,i].
    MatmulEpilogue ep;
    ep.col_bias = bias;
    ep.round_bf16 = s.round_outputs;
    matmul_canonical(s.N, s.OC, s.IC, out, s.OC, inp, s.IC, 1, weight, 1, s.IC, ep, s.operands);
    return;
  }
  sgemm_threads(false, true, s.N, s.OC, s.IC, 1.0f, inp, s.IC, weight, s.IC, 0.0f, out, s.OC, s.operands,
                {.col_bias = bias, .round_bf16 = s.round_outputs}, r.rounds);
}

void linear_backward(Mode mode, LinearShape s, int64_t token_offset, float* dinp,
                     GradSink dweight, GradSink dbias, const float* dout, const float* inp,
                     const float* weight) {
  check_shape(s);
  check_sink(mode, dweight, "dweight");
  check_sink(mode, dbias, "dbias");
  if (mode == Mode::kCanonical) {
    const int64_t chunk = s.accumulation == Accumulation::kHopperFp8 ? kFp8PromotionInterval : kCanonicalChunk;
    LS_CHECK(token_offset >= 0 && token_offset % chunk == 0, "linear_backward(canonical): token_offset ",
             token_offset, " must be a multiple of the canonical chunk (", chunk,
             "): a split of the token range may not cut a chunk");
  }
  const ReadOperands r = read_operands(mode, s, dout, weight);
  dout = r.dout;
  weight = r.weight;
  if (s.accumulation == Accumulation::kHopperFp8) {
    hopper_backward(mode, s, dinp, dweight, dout, inp, weight);
  } else if (mode == Mode::kCanonical) {
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
  } else {
    if (dinp != nullptr && s.N > 0 && s.IC > 0) {
      sgemm_threads(false, false, s.N, s.IC, s.OC, 1.0f, dout, s.OC, weight, s.IC, 0.0f, dinp, s.IC, s.operands,
                    {.round_bf16 = s.round_outputs}, r.rounds);
    }
    if (!dweight.empty() && s.OC > 0 && s.IC > 0) {
      sgemm_threads(true, false, s.OC, s.IC, s.N, 1.0f, dout, s.OC, inp, s.IC, 1.0f, dweight.f32, s.IC,
                    s.operands, {}, {.a = r.rounds.a});
    }
  }
  if (dbias.empty()) return;
  if (mode == Mode::kCanonical) {
    bias_grad_canonical(s, dbias, dout);
  } else if (r.rounds.a) {
    bias_grad_fast<true>(s, dbias.f32, dout);
  } else {
    bias_grad_fast<false>(s, dbias.f32, dout);
  }
}

void linear_forward_partials(LinearShape s, ExactAccumulator& out, const float* inp,
                             const float* weight) {
  check_shape(s);
  LS_CHECK(!s.round_outputs, "linear_forward_partials: partial sums take no rounding to bf16");
  weight = read_operands(Mode::kCanonical, s, nullptr, weight).weight;
  if (s.accumulation == Accumulation::kHopperFp8) {
    return hopper_forward(Mode::kCanonical, s, inp, weight, {.exact = &out});
  }
  // out[n,o] = Σ_i inp[n,i]·weight[o,i]: B[i,o] = weight[o,i].
  matmul_chunks_exact(s.N, s.OC, s.IC, out, 0, inp, s.IC, 1, weight, 1, s.IC, s.operands);
}

void linear_backward_dinp_partials(LinearShape s, ExactAccumulator& dinp, const float* dout,
                                   const float* weight) {
  check_shape(s);
  LS_CHECK(!s.round_outputs, "linear_backward_dinp_partials: partial sums take no rounding to bf16");
  const ReadOperands r = read_operands(Mode::kCanonical, s, dout, weight);
  dout = r.dout;
  weight = r.weight;
  // forward: out = inp · weightᵀ  ->  dinp[n,i] = Σ_o dout[n,o]·weight[o,i]
  if (s.accumulation == Accumulation::kHopperFp8) {
    return matmul_fp8_hopper(Mode::kCanonical, s.N, s.IC, s.OC, dout, s.OC, 1, weight, s.IC, 1, {.exact = &dinp});
  }
  matmul_chunks_exact(s.N, s.IC, s.OC, dinp, 0, dout, s.OC, 1, weight, s.IC, 1, s.operands);
}

}  // namespace lockstep::cpu
