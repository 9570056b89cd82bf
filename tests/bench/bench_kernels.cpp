// lockstep-kernel-bench: Google Benchmark suite for every CPU kernel, forward and backward, in
// both modes, at the shapes of scripts/configs/bench_small.toml and bench_medium.toml, with
// OpenBLAS cblas_sgemm next to our canonical and fast GEMMs at the same shapes.
//
// Names: BM_<op>_<mode> (BM_sgemm_openblas for the library GEMM, BM_matmul_fast for Lockstep's,
// which fast mode runs where OpenBLAS's kernel is narrower than the CPU: the fast-mode linear
// benchmarks time whichever sgemm_threads picks, printed at start-up); the argument `shape` is 0 for
// bench_small, 1 for bench_medium (`gemm` selects the product: 0 qkv, 1 fc, 2 head, 3 the head's
// input gradient, whose K is the vocabulary). Counters are
// rates: FLOP/s for products (2 per multiply-add, causal attention counting only t' <= t) and
// bytes/s for memory-bound ops (each fp32 array read or written once counted at 4 bytes/element).
// Times are wall-clock (UseRealTime: the kernels run OpenMP/OpenBLAS threads), and so are the rates.
// Threads: OpenMP and OpenBLAS defaults (set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to pin them).
// ISA: the widest the CPU has; --isa=avx2 or --isa=avx512 (first argument) chooses, so that one
// binary times a kernel's two vector widths.
// Before timing, main() checks matmul_canonical bitwise against canonical_dot, and cblas_sgemm and
// matmul_fast against it within the dot-product bound; a mismatch exits non-zero.
// JSON: --benchmark_out=FILE --benchmark_out_format=json.
// Not here: timing assertions, CUDA kernels, the whole training step (`lockstep bench`).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/optim.hpp"
#include "src/core/exact_sum.hpp"

namespace {

using namespace lockstep;

// The bench configs' model shapes (scripts/configs/bench_*.toml).
struct ModelShape {
  int64_t B, T, C, NH, V, L;
  int64_t BT() const { return B * T; }
  int64_t F() const { return 4 * C; }  // GELU MLP width; SwiGLU benchmarks use the same F
  int64_t params() const { return 12 * L * C * C + V * C + T * C; }  // matrices + wte + wpe
};
constexpr ModelShape kShapes[] = {
    {8, 128, 256, 4, 4096, 4},  // bench_small
    {4, 256, 512, 8, 8192, 6},  // bench_medium
};

const ModelShape& shape_of(const benchmark::State& state) { return kShapes[state.range(0)]; }

// Deterministic inputs in [-1, 1) (dyadic, 2^-23 steps).
std::vector<float> filled(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (auto& v : x) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
  }
  return x;
}

std::vector<int32_t> tokens(int64_t n, int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 2654435761LL) % V);
  return t;
}

void rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// Canonical mode accumulates parameter gradients exactly (as the model does); fast mode into fp32.
struct Sink {
  Sink(Mode mode, int64_t n) : f32(static_cast<size_t>(n)), exact(mode == Mode::kCanonical ? n : 0), mode(mode) {}
  GradSink get() { return mode == Mode::kCanonical ? GradSink{nullptr, &exact, 0} : GradSink{f32.data(), nullptr, 0}; }
  std::vector<float> f32;
  ExactAccumulator exact;
  Mode mode;
};

// ---- GEMMs: (M, N, K) = (B·T, out, C) for qkv, fc and the tied head; (B·T, C, V) for the head's
// input gradient.
struct Gemm {
  int64_t M, N, K;
};
Gemm gemm_of(const benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  if (state.range(1) == 3) return {s.BT(), s.C, s.V};
  const int64_t out[] = {3 * s.C, s.F(), s.V};
  return {s.BT(), out[state.range(1)], s.C};
}

void BM_matmul_canonical(benchmark::State& state) {
  const Gemm g = gemm_of(state);
  const auto a = filled(g.M * g.K, 1), b = filled(g.K * g.N, 2);
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  for (auto _ : state) {
    cpu::matmul_canonical(g.M, g.N, g.K, c.data(), g.N, a.data(), g.K, 1, b.data(), g.N, 1);
    benchmark::DoNotOptimize(c.data());
  }
  rate(state, "FLOP/s", 2.0 * g.M * g.N * g.K);
}

void BM_matmul_fast(benchmark::State& state) {
  const Gemm g = gemm_of(state);
  const auto a = filled(g.M * g.K, 1), b = filled(g.K * g.N, 2);
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  for (auto _ : state) {
    cpu::matmul_fast(g.M, g.N, g.K, 1.0f, a.data(), g.K, 1, b.data(), g.N, 1, 0.0f, c.data(), g.N);
    benchmark::DoNotOptimize(c.data());
  }
  rate(state, "FLOP/s", 2.0 * g.M * g.N * g.K);
}

void BM_sgemm_openblas(benchmark::State& state) {
  const Gemm g = gemm_of(state);
  const auto a = filled(g.M * g.K, 1), b = filled(g.K * g.N, 2);
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(g.M), static_cast<int>(g.N),
                static_cast<int>(g.K), 1.0f, a.data(), static_cast<int>(g.K), b.data(), static_cast<int>(g.N),
                0.0f, c.data(), static_cast<int>(g.N));
    benchmark::DoNotOptimize(c.data());
  }
  rate(state, "FLOP/s", 2.0 * g.M * g.N * g.K);
}

// ---- linear (the MLP's fc: C -> 4C, with bias).
template <Mode M>
void BM_linear_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const LinearShape ls{s.BT(), s.C, s.F()};
  const auto inp = filled(ls.N * ls.IC, 1), w = filled(ls.OC * ls.IC, 2), bias = filled(ls.OC, 3);
  std::vector<float> out(static_cast<size_t>(ls.N * ls.OC));
  for (auto _ : state) {
    cpu::linear_forward(M, ls, out.data(), inp.data(), w.data(), bias.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "FLOP/s", 2.0 * ls.N * ls.IC * ls.OC);
}

template <Mode M>
void BM_linear_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const LinearShape ls{s.BT(), s.C, s.F()};
  const auto inp = filled(ls.N * ls.IC, 1), w = filled(ls.OC * ls.IC, 2), dout = filled(ls.N * ls.OC, 4);
  std::vector<float> dinp(static_cast<size_t>(ls.N * ls.IC));
  Sink dw(M, ls.OC * ls.IC), db(M, ls.OC);
  for (auto _ : state) {
    cpu::linear_backward(M, ls, 0, dinp.data(), dw.get(), db.get(), dout.data(), inp.data(), w.data());
    benchmark::DoNotOptimize(dinp.data());
  }
  rate(state, "FLOP/s", 4.0 * ls.N * ls.IC * ls.OC);  // dinp and dweight products
}

// ---- attention (causal, NKV = NH as in the bench configs).
AttentionShape attention_shape(const ModelShape& s) { return {s.B, s.T, s.NH, s.NH, s.C / s.NH}; }
// Scores and values over t' <= t: 2 products of T(T+1)/2 · HS multiply-adds per head.
double attention_flops(const AttentionShape& a) {
  return 2.0 * 2.0 * static_cast<double>(a.B * a.NH * a.HS) * static_cast<double>(a.T * (a.T + 1) / 2);
}

template <Mode M>
void BM_attention_forward(benchmark::State& state) {
  const AttentionShape a = attention_shape(shape_of(state));
  const auto qkv = filled(a.B * a.T * 3 * a.NH * a.HS, 1);
  std::vector<float> out(static_cast<size_t>(a.B * a.T * a.NH * a.HS));
  std::vector<float> att(static_cast<size_t>(a.B * a.NH * a.T * a.T));
  for (auto _ : state) {
    cpu::attention_forward(M, a, out.data(), att.data(), qkv.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "FLOP/s", attention_flops(a));
}

template <Mode M>
void BM_attention_backward(benchmark::State& state) {
  const AttentionShape a = attention_shape(shape_of(state));
  const auto qkv = filled(a.B * a.T * 3 * a.NH * a.HS, 1), dout = filled(a.B * a.T * a.NH * a.HS, 2);
  std::vector<float> out(dout.size()), att(static_cast<size_t>(a.B * a.NH * a.T * a.T)), scratch(att.size());
  std::vector<float> dqkv(qkv.size());
  cpu::attention_forward(M, a, out.data(), att.data(), qkv.data());
  for (auto _ : state) {
    cpu::attention_backward(M, a, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data());
    benchmark::DoNotOptimize(dqkv.data());
  }
  rate(state, "FLOP/s", 2.0 * attention_flops(a));  // datt, dq, dk, dv: twice the forward products
}

// ---- norms (rows B·T, width C).
template <Mode M>
void BM_layernorm_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const NormShape ns{s.BT(), s.C};
  const auto inp = filled(ns.N * ns.C, 1), w = filled(ns.C, 2), b = filled(ns.C, 3);
  std::vector<float> out(inp.size()), mean(static_cast<size_t>(ns.N)), rstd(mean.size());
  for (auto _ : state) {
    cpu::layernorm_forward(M, ns, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "bytes/s", 4.0 * 2 * ns.N * ns.C);
}

template <Mode M>
void BM_layernorm_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const NormShape ns{s.BT(), s.C};
  const auto inp = filled(ns.N * ns.C, 1), w = filled(ns.C, 2), b = filled(ns.C, 3), dout = filled(ns.N * ns.C, 4);
  std::vector<float> out(inp.size()), mean(static_cast<size_t>(ns.N)), rstd(mean.size()), dinp(inp.size());
  cpu::layernorm_forward(M, ns, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data());
  Sink dw(M, ns.C), db(M, ns.C);
  for (auto _ : state) {
    cpu::layernorm_backward(M, ns, 0, dinp.data(), dw.get(), db.get(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data());
    benchmark::DoNotOptimize(dinp.data());
  }
  rate(state, "bytes/s", 4.0 * 4 * ns.N * ns.C);  // read inp, dout, dinp; write dinp
}

template <Mode M>
void BM_rmsnorm_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const NormShape ns{s.BT(), s.C};
  const auto inp = filled(ns.N * ns.C, 1), w = filled(ns.C, 2);
  std::vector<float> out(inp.size()), rstd(static_cast<size_t>(ns.N));
  for (auto _ : state) {
    cpu::rmsnorm_forward(M, ns, out.data(), rstd.data(), inp.data(), w.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "bytes/s", 4.0 * 2 * ns.N * ns.C);
}

template <Mode M>
void BM_rmsnorm_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const NormShape ns{s.BT(), s.C};
  const auto inp = filled(ns.N * ns.C, 1), w = filled(ns.C, 2), dout = filled(ns.N * ns.C, 4);
  std::vector<float> out(inp.size()), rstd(static_cast<size_t>(ns.N)), dinp(inp.size());
  cpu::rmsnorm_forward(M, ns, out.data(), rstd.data(), inp.data(), w.data());
  Sink dw(M, ns.C);
  for (auto _ : state) {
    cpu::rmsnorm_backward(M, ns, 0, dinp.data(), dw.get(), dout.data(), inp.data(), w.data(), rstd.data());
    benchmark::DoNotOptimize(dinp.data());
  }
  rate(state, "bytes/s", 4.0 * 4 * ns.N * ns.C);
}

// ---- activations over the MLP hidden (B·T, F).
template <Mode M>
void BM_gelu_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const int64_t n = s.BT() * s.F();
  const auto inp = filled(n, 1);
  std::vector<float> out(inp.size());
  for (auto _ : state) {
    cpu::gelu_forward(M, n, out.data(), inp.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "bytes/s", 4.0 * 2 * n);
}

template <Mode M>
void BM_gelu_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const int64_t n = s.BT() * s.F();
  const auto inp = filled(n, 1), dout = filled(n, 2);
  std::vector<float> dinp(inp.size());
  for (auto _ : state) {
    cpu::gelu_backward(M, n, dinp.data(), inp.data(), dout.data());
    benchmark::DoNotOptimize(dinp.data());
  }
  rate(state, "bytes/s", 4.0 * 3 * n);
}

template <Mode M>
void BM_swiglu_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const int64_t N = s.BT(), F = s.F();
  const auto inp = filled(N * 2 * F, 1);
  std::vector<float> out(static_cast<size_t>(N * F));
  for (auto _ : state) {
    cpu::swiglu_forward(M, N, F, out.data(), inp.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "bytes/s", 4.0 * 3 * N * F);
}

template <Mode M>
void BM_swiglu_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const int64_t N = s.BT(), F = s.F();
  const auto inp = filled(N * 2 * F, 1), dout = filled(N * F, 2);
  std::vector<float> dinp(inp.size());
  for (auto _ : state) {
    cpu::swiglu_backward(M, N, F, dinp.data(), inp.data(), dout.data());
    benchmark::DoNotOptimize(dinp.data());
  }
  rate(state, "bytes/s", 4.0 * 5 * N * F);
}

// ---- cross-entropy over (B·T, V) logits.
template <Mode M>
void BM_crossentropy_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const CrossEntropyShape cs{s.BT(), s.V};
  const auto logits = filled(cs.N * cs.V, 1);
  const auto targets = tokens(cs.N, cs.V);
  std::vector<float> losses(static_cast<size_t>(cs.N));
  for (auto _ : state) {
    cpu::crossentropy_forward(M, cs, losses.data(), logits.data(), targets.data());
    benchmark::DoNotOptimize(losses.data());
  }
  rate(state, "bytes/s", 4.0 * cs.N * cs.V);
}

// Forward and backward are one kernel (dlogits overwrite the logits); each iteration restores the
// logits first, outside the timed region.
template <Mode M>
void BM_crossentropy_forward_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const CrossEntropyShape cs{s.BT(), s.V};
  const auto logits = filled(cs.N * cs.V, 1);
  const auto targets = tokens(cs.N, cs.V);
  std::vector<float> work(logits.size()), losses(static_cast<size_t>(cs.N));
  const float dloss = 1.0f / static_cast<float>(cs.N);
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(logits.begin(), logits.end(), work.begin());
    state.ResumeTiming();
    cpu::crossentropy_forward_backward(M, cs, dloss, losses.data(), work.data(), targets.data());
    benchmark::DoNotOptimize(work.data());
  }
  rate(state, "bytes/s", 4.0 * 2 * cs.N * cs.V);
}

// ---- embedding (token + learned position).
template <Mode M>
void BM_embedding_forward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const EmbeddingShape es{s.B, s.T, s.C, s.V};
  const auto wte = filled(es.V * es.C, 1), wpe = filled(es.T * es.C, 2);
  const auto tok = tokens(es.B * es.T, es.V);
  std::vector<float> out(static_cast<size_t>(es.B * es.T * es.C));
  for (auto _ : state) {
    cpu::embedding_forward(M, es, out.data(), tok.data(), wte.data(), wpe.data());
    benchmark::DoNotOptimize(out.data());
  }
  rate(state, "bytes/s", 4.0 * 3 * es.B * es.T * es.C);
}

template <Mode M>
void BM_embedding_backward(benchmark::State& state) {
  const ModelShape& s = shape_of(state);
  const EmbeddingShape es{s.B, s.T, s.C, s.V};
  const auto dout = filled(es.B * es.T * es.C, 1);
  const auto tok = tokens(es.B * es.T, es.V);
  Sink dwte(M, es.V * es.C), dwpe(M, es.T * es.C);
  for (auto _ : state) {
    cpu::embedding_backward(M, es, 0, dwte.get(), dwpe.get(), dout.data(), tok.data());
    benchmark::ClobberMemory();
  }
  rate(state, "bytes/s", 4.0 * 3 * es.B * es.T * es.C);
}

// ---- optimizer over a buffer the size of the model's parameters. AdamW has no mode (same bits).
void BM_adamw(benchmark::State& state) {
  const int64_t n = shape_of(state).params();
  auto param = filled(n, 1), m = filled(n, 2), v = filled(n, 3);
  for (auto& x : v) x = x * x;
  const auto grad = filled(n, 4);
  const AdamWParams h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};
  for (auto _ : state) {
    cpu::adamw_update(n, h, param.data(), m.data(), v.data(), grad.data());
    benchmark::ClobberMemory();
  }
  rate(state, "bytes/s", 4.0 * 7 * n);  // read p, m, v, g; write p, m, v
}

template <Mode M>
void BM_grad_sumsq(benchmark::State& state) {
  const int64_t n = shape_of(state).params();
  const auto grad = filled(n, 1);
  for (auto _ : state) {
    ChunkCombiner acc;
    cpu::grad_sumsq_accumulate(M, n, acc, grad.data());
    benchmark::DoNotOptimize(acc.finish());
  }
  rate(state, "bytes/s", 4.0 * n);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgName("shape")->DenseRange(0, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
}
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "gemm"})->ArgsProduct({{0, 1}, {0, 1, 2, 3}});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

constexpr Mode kC = Mode::kCanonical, kF = Mode::kFast;

BENCHMARK(BM_matmul_canonical)->Apply(gemm_shapes);
BENCHMARK(BM_matmul_fast)->Apply(gemm_shapes);
BENCHMARK(BM_sgemm_openblas)->Apply(gemm_shapes);
BENCHMARK(BM_linear_forward<kC>)->Name("BM_linear_forward_canonical")->Apply(shapes);
BENCHMARK(BM_linear_forward<kF>)->Name("BM_linear_forward_fast")->Apply(shapes);
BENCHMARK(BM_linear_backward<kC>)->Name("BM_linear_backward_canonical")->Apply(shapes);
BENCHMARK(BM_linear_backward<kF>)->Name("BM_linear_backward_fast")->Apply(shapes);
BENCHMARK(BM_attention_forward<kC>)->Name("BM_attention_forward_canonical")->Apply(shapes);
BENCHMARK(BM_attention_forward<kF>)->Name("BM_attention_forward_fast")->Apply(shapes);
BENCHMARK(BM_attention_backward<kC>)->Name("BM_attention_backward_canonical")->Apply(shapes);
BENCHMARK(BM_attention_backward<kF>)->Name("BM_attention_backward_fast")->Apply(shapes);
BENCHMARK(BM_layernorm_forward<kC>)->Name("BM_layernorm_forward_canonical")->Apply(shapes);
BENCHMARK(BM_layernorm_forward<kF>)->Name("BM_layernorm_forward_fast")->Apply(shapes);
BENCHMARK(BM_layernorm_backward<kC>)->Name("BM_layernorm_backward_canonical")->Apply(shapes);
BENCHMARK(BM_layernorm_backward<kF>)->Name("BM_layernorm_backward_fast")->Apply(shapes);
BENCHMARK(BM_rmsnorm_forward<kC>)->Name("BM_rmsnorm_forward_canonical")->Apply(shapes);
BENCHMARK(BM_rmsnorm_forward<kF>)->Name("BM_rmsnorm_forward_fast")->Apply(shapes);
BENCHMARK(BM_rmsnorm_backward<kC>)->Name("BM_rmsnorm_backward_canonical")->Apply(shapes);
BENCHMARK(BM_rmsnorm_backward<kF>)->Name("BM_rmsnorm_backward_fast")->Apply(shapes);
BENCHMARK(BM_gelu_forward<kC>)->Name("BM_gelu_forward_canonical")->Apply(shapes);
BENCHMARK(BM_gelu_forward<kF>)->Name("BM_gelu_forward_fast")->Apply(shapes);
BENCHMARK(BM_gelu_backward<kC>)->Name("BM_gelu_backward_canonical")->Apply(shapes);
BENCHMARK(BM_gelu_backward<kF>)->Name("BM_gelu_backward_fast")->Apply(shapes);
BENCHMARK(BM_swiglu_forward<kC>)->Name("BM_swiglu_forward_canonical")->Apply(shapes);
BENCHMARK(BM_swiglu_forward<kF>)->Name("BM_swiglu_forward_fast")->Apply(shapes);
BENCHMARK(BM_swiglu_backward<kC>)->Name("BM_swiglu_backward_canonical")->Apply(shapes);
BENCHMARK(BM_swiglu_backward<kF>)->Name("BM_swiglu_backward_fast")->Apply(shapes);
BENCHMARK(BM_crossentropy_forward<kC>)->Name("BM_crossentropy_forward_canonical")->Apply(shapes);
BENCHMARK(BM_crossentropy_forward<kF>)->Name("BM_crossentropy_forward_fast")->Apply(shapes);
BENCHMARK(BM_crossentropy_forward_backward<kC>)->Name("BM_crossentropy_forward_backward_canonical")->Apply(shapes);
BENCHMARK(BM_crossentropy_forward_backward<kF>)->Name("BM_crossentropy_forward_backward_fast")->Apply(shapes);
BENCHMARK(BM_embedding_forward<kC>)->Name("BM_embedding_forward_canonical")->Apply(shapes);
BENCHMARK(BM_embedding_forward<kF>)->Name("BM_embedding_forward_fast")->Apply(shapes);
BENCHMARK(BM_embedding_backward<kC>)->Name("BM_embedding_backward_canonical")->Apply(shapes);
BENCHMARK(BM_embedding_backward<kF>)->Name("BM_embedding_backward_fast")->Apply(shapes);
BENCHMARK(BM_adamw)->Apply(shapes);
BENCHMARK(BM_grad_sumsq<kC>)->Name("BM_grad_sumsq_canonical")->Apply(shapes);
BENCHMARK(BM_grad_sumsq<kF>)->Name("BM_grad_sumsq_fast")->Apply(shapes);

// The check before timing, on the bench_small fc product: matmul_canonical must equal
// canonical_dot bit for bit on sampled elements; cblas_sgemm (any order) must lie within
// gamma(K)·Σ|a·b| of it per element, gamma(K) = K·u/(1 − K·u), u = 2^-24, doubled because both
// results carry their own rounding error. Returns false after printing the first mismatch.
bool results_match() {
  const ModelShape& s = kShapes[0];
  const int64_t M = s.BT(), N = s.F(), K = s.C;
  const auto a = filled(M * K, 1), b = filled(K * N, 2);
  std::vector<float> canon(static_cast<size_t>(M * N)), blas(canon.size()), fast(canon.size());
  cpu::matmul_canonical(M, N, K, canon.data(), N, a.data(), K, 1, b.data(), N, 1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(), static_cast<int>(N), 0.0f,
              blas.data(), static_cast<int>(N));
  cpu::matmul_fast(M, N, K, 1.0f, a.data(), K, 1, b.data(), N, 1, 0.0f, fast.data(), N);
  const double u = 0x1p-24, gamma = static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
  for (int64_t m = 0; m < M; m += 37) {
    for (int64_t n = 0; n < N; n += 29) {
      const float want = canonical_dot(a.data() + m * K, 1, b.data() + n, N, K);
      const float got = canon[static_cast<size_t>(m * N + n)];
      if (std::memcmp(&want, &got, sizeof want) != 0) {
        std::fprintf(stderr, "matmul_canonical(%lld,%lld) = %a, canonical_dot = %a\n", static_cast<long long>(m),
                     static_cast<long long>(n), static_cast<double>(got), static_cast<double>(want));
        return false;
      }
      double abs_sum = 0;
      for (int64_t k = 0; k < K; ++k) abs_sum += std::fabs(static_cast<double>(a[m * K + k]) * b[k * N + n]);
      for (const auto& [name, c] : {std::pair{"cblas_sgemm", &blas}, std::pair{"matmul_fast", &fast}}) {
        const double err = std::fabs(static_cast<double>((*c)[static_cast<size_t>(m * N + n)]) - got);
        if (err > 2 * gamma * abs_sum) {
          std::fprintf(stderr, "%s(%lld,%lld) differs from canonical by %g > bound %g\n", name,
                       static_cast<long long>(m), static_cast<long long>(n), err, 2 * gamma * abs_sum);
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strncmp(argv[1], "--isa=", 6) == 0) {
    cpu::set_isa(std::strcmp(argv[1] + 6, "avx2") == 0 ? cpu::Isa::kAvx2 : cpu::Isa::kAvx512);
    std::copy(argv + 2, argv + argc, argv + 1);
    --argc;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!results_match()) return 1;
  std::printf("All results match (matmul_canonical == canonical_dot bitwise; sgemm within bound). ISA %s; "
              "fast mode's GEMM %s. Starting benchmarks.\n",
              std::string(cpu::isa_name(cpu::active_isa())).c_str(), cpu::fast_gemm_name().c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
