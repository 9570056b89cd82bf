// lockstep-kernel-bench: Google Benchmark suite for every op of kernels/ops/ops.def (generated from
// the op test driver's cases), forward and backward, in both modes, at the shapes of
// scripts/configs/bench_small.toml and bench_medium.toml, and OpenBLAS cblas_sgemm next to our
// canonical and fast GEMMs at the model's products.
//
// Names: BM_<op>_<mode> (BM_sgemm_openblas for the library GEMM, BM_matmul_fast for Lockstep's,
// which fast mode runs where OpenBLAS's kernel is narrower than the CPU: the fast-mode linear
// benchmarks time whichever sgemm_threads picks, printed at start-up); the argument `shape` is 0 for
// bench_small, 1 for bench_medium (`gemm` selects the product: 0 qkv, 1 fc, 2 head, 3 the head's
// input gradient, whose K is the vocabulary); each op's label gives its dims. Counters are
// rates: FLOP/s for products (2 per multiply-add, causal attention counting its full T×T) and
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
#include "kernels/ops/cast.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/ops/canonical.hpp"
#include "src/core/exact_sum.hpp"
#include "tests/support/op_cases.hpp"

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

void rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

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

// The operands of a GEMM benchmark: filled(), rounded to bf16 for Operands::kBf16 (whose products
// run VDPBF16PS where the CPU has it, cpu::bf16_kernel_name()).
std::vector<float> operand(int64_t n, uint64_t seed, Operands operands) {
  auto x = filled(n, seed);
  if (operands == Operands::kBf16) cpu::round_to_bf16(n, x.data(), x.data());
  return x;
}

template <Operands kOperands>
void BM_matmul_canonical(benchmark::State& state) {
  const Gemm g = gemm_of(state);
  const auto a = operand(g.M * g.K, 1, kOperands), b = operand(g.K * g.N, 2, kOperands);
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  for (auto _ : state) {
    cpu::matmul_canonical(g.M, g.N, g.K, c.data(), g.N, a.data(), g.K, 1, b.data(), g.N, 1, cpu::MatmulEpilogue{},
                          kOperands);
    benchmark::DoNotOptimize(c.data());
  }
  rate(state, "FLOP/s", 2.0 * g.M * g.N * g.K);
}

template <Operands kOperands>
void BM_matmul_fast(benchmark::State& state) {
  const Gemm g = gemm_of(state);
  const auto a = operand(g.M * g.K, 1, kOperands), b = operand(g.K * g.N, 2, kOperands);
  std::vector<float> c(static_cast<size_t>(g.M * g.N));
  for (auto _ : state) {
    cpu::matmul_fast(g.M, g.N, g.K, 1.0f, a.data(), g.K, 1, b.data(), g.N, 1, 0.0f, c.data(), g.N, kOperands);
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

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgName("shape")->DenseRange(0, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
}
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "gemm"})->ArgsProduct({{0, 1}, {0, 1, 2, 3}});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_matmul_canonical<Operands::kFp32>)->Name("BM_matmul_canonical")->Apply(gemm_shapes);
BENCHMARK(BM_matmul_fast<Operands::kFp32>)->Name("BM_matmul_fast")->Apply(gemm_shapes);
BENCHMARK(BM_matmul_canonical<Operands::kBf16>)->Name("BM_matmul_canonical_bf16")->Apply(gemm_shapes);
BENCHMARK(BM_matmul_fast<Operands::kBf16>)->Name("BM_matmul_fast_bf16")->Apply(gemm_shapes);
BENCHMARK(BM_sgemm_openblas)->Apply(gemm_shapes);

// Every op of ops.def in both modes at both bench shapes, from the op test driver's cases
// (tests/support/op_cases.hpp): BM_<op>_<mode>/shape:S. One run untimed first (page faults,
// caches); in-place ops then work on their own outputs, which does not change their cost.
void register_ops() {
  for (const test::OpEntry& op : test::op_entries()) {
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      const std::string name = "BM_" + std::string(op.name) + "_" + std::string(mode_name(mode));
      benchmark::RegisterBenchmark(name.c_str(), [&op, mode](benchmark::State& state) {
        const auto size = state.range(0) == 0 ? test::SizeClass::kBenchSmall : test::SizeClass::kBenchMedium;
        const auto c = op.make({size, test::ValueClass::kOrdinary, 1});
        Backend& be = process_backend();
        c->run(be, mode);
        for (auto _ : state) c->run(be, mode);
        if (c->flops() > 0) rate(state, "FLOP/s", c->flops());
        if (c->bytes() > 0) rate(state, "bytes/s", c->bytes());
        state.SetLabel(c->shape());
      })->Apply(shapes);
    }
  }
}

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
  register_ops();
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
