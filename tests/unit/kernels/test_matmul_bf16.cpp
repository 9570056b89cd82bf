// Tests of the products of bf16 operands (Operands::kBf16, kernels/cpu/matmul.hpp): the VDPBF16PS
// build must give canonical_dot's bits wherever its instruction's flushes cannot occur and fall
// back to FMAs where they can — ±0, bf16 subnormals, products below 2^-126, overflow, inf/NaN —
// on 1, 2 and 3 threads and every stride layout; fast mode must stay within the fast-mode dot bound
// plus the flush term; an operand that is not bf16 is an error. First, the instruction's own
// semantics the kernel's argument rests on, on this CPU.
#include <gtest/gtest.h>
#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_peak.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "kernels/ops/cast.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"
#include "src/core/formats.hpp"
#include "tests/support/random_values.hpp"
#include "tests/unit/kernels/matrix_util.hpp"
#include "verify/core/bounds.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::cpu {
namespace {

using test::StridedMatrix;

struct ScopedBf16Kernel {
  Bf16Kernel previous = active_bf16_kernel();
  explicit ScopedBf16Kernel(Bf16Kernel k) { set_bf16_kernel(k); }
  ~ScopedBf16Kernel() { set_bf16_kernel(previous); }
};

struct ScopedThreads {
  int previous = omp_get_max_threads();
  explicit ScopedThreads(int n) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous); }
};

float bf16(float x) { return bf16_to_f32(bf16_from_f32(x)); }

// One VDPBF16PS on lane 0: acc + the products of the pairs (a_hi, b_hi) and (a_lo, b_lo), the pair
// words' high and low halves.
[[gnu::target("avx512f,avx512bf16")]] float dpbf16_lane(float acc, float a_hi, float a_lo, float b_hi, float b_lo) {
  alignas(64) uint16_t a[32] = {}, b[32] = {};
  a[0] = bf16_from_f32(a_lo);
  a[1] = bf16_from_f32(a_hi);
  b[0] = bf16_from_f32(b_lo);
  b[1] = bf16_from_f32(b_hi);
  const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc), (__m512bh)_mm512_load_si512(a), (__m512bh)_mm512_load_si512(b));
  alignas(64) float out[16];
  _mm512_store_ps(out, r);
  return out[0];
}

// The kernel relies on: the high halves' product is added first, each addition rounded to nearest
// even (not one fused rounding), subnormal inputs read as zero, subnormal results flushed.
TEST(Bf16DotInstruction, AddsHighHalvesFirstRoundingEachAdditionAndFlushesSubnormals) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  const float q = std::ldexp(1.0f, -12);  // q·q = 2^-24: half an ulp of 1
  // 1 + 2^-24 ties to 1, twice: sequential roundings; a fused sum would give 1 + 2^-23.
  EXPECT_EQ(dpbf16_lane(1.0f, q, q, q, q), 1.0f);
  // Order: with products 2^-24 (high) and 1.5·2^-24 (low), high first gives 1 (a tie) and then
  // 1 + 2^-23; low first gives 1 + 2^-23 and then 1 + 2^-22 (a tie to even). The kernel packs k in
  // the high half, k + 1 in the low.
  const float seq_high_first = std::fma(1.5f * q, q, std::fma(q, q, 1.0f));
  const float seq_low_first = std::fma(q, q, std::fma(1.5f * q, q, 1.0f));
  ASSERT_NE(seq_high_first, seq_low_first);
  EXPECT_EQ(dpbf16_lane(1.0f, q, 1.5f * q, q, q), seq_high_first);
  // A bf16 subnormal input reads as zero; a product below 2^-126 is flushed.
  EXPECT_EQ(dpbf16_lane(0.0f, std::ldexp(1.0f, -130), 0.0f, 1.0f, 0.0f), 0.0f);
  EXPECT_EQ(dpbf16_lane(0.0f, std::ldexp(1.0f, -70), 0.0f, std::ldexp(1.0f, -70), 0.0f), 0.0f);
}

// bf16 operands that stress the product, by rows of A and columns of B (a dot whose terms are all
// tiny is where a flush shows): spread normals; tiny normals (2^-70 and 2^-58: their products fall
// below 2^-126, or just above it); and the adversarial fp32 values rounded to bf16 (±0, subnormals,
// overflow, inf, NaN) among normals.
float bf16_value(std::mt19937_64& g, int kind) {
  switch (kind) {
    case 1: return bf16(std::ldexp(test::random_value(g), -70));
    case 2: return bf16(std::ldexp(test::random_value(g), -58));
    case 3: return bf16(test::special_value(g));
    default: return bf16(test::random_value(g));
  }
}

struct Operands2 {
  StridedMatrix A, B;
  Operands2(int64_t M, int64_t N, int64_t K, int la, int lb, bool special, uint64_t seed)
      : A(M, K, la), B(K, N, lb) {
    std::mt19937_64 g(seed);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) A(i, k) = bf16_value(g, special ? static_cast<int>(i % 4) : 0);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) B(k, j) = bf16_value(g, special ? static_cast<int>((j / 3) % 4) : 0);
  }
};

std::string where(int64_t M, int64_t N, int64_t K, int la, int lb, bool special, int threads) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " layouts " +
         std::to_string(la) + "," + std::to_string(lb) + (special ? " special" : "") + " threads " +
         std::to_string(threads);
}

TEST(MatmulBf16, CanonicalEqualsCanonicalDotOnEveryPathAndThreadCount) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  ScopedIsa isa(Isa::kAvx512);
  ScopedBf16Kernel dots(Bf16Kernel::kDot);
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1},    {7, 33, 63},   {13, 40, 64},  {21, 70, 65},
                          {30, 31, 129}, {45, 65, 1000}, {12, 100, 1500}, {64, 50, 3000},
                          {20, 40, 5000}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (bool special : {false, true}) {
      const int la = static_cast<int>(seed % test::kLayouts), lb = static_cast<int>((seed / 2) % test::kLayouts);
      const Operands2 op(s.M, s.N, s.K, la, lb, special, seed++);
      const auto& A = op.A;
      const auto& B = op.B;
      const auto want = test::canonical_product_spec(s.M, s.N, s.K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
      for (int threads : {1, 2, 3}) {
        ScopedThreads t(threads);
        const std::string w = where(s.M, s.N, s.K, la, lb, special, threads);
        std::vector<float> C(static_cast<size_t>(s.M * s.N));
        matmul_canonical(s.M, s.N, s.K, C.data(), s.N, A.at, A.srow, A.scol, B.at, B.srow, B.scol, MatmulEpilogue{},
                         Operands::kBf16);
        const auto r = verify::compare_exact(C.data(), want.data(), s.M * s.N);
        ASSERT_TRUE(r.ok()) << r.summary("matmul_canonical bf16, " + w);
        // The chunk partials' exact sums, against adding canonical_dot's chunks one by one.
        ExactAccumulator want_acc(static_cast<size_t>(s.M * s.N)), acc(static_cast<size_t>(s.M * s.N));
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = 0; n < s.N; ++n)
            for (int64_t k0 = 0; k0 < s.K; k0 += kCanonicalChunk)
              want_acc.add(static_cast<size_t>(m * s.N + n),
                           chunk_dot(A.at + m * A.srow + k0 * A.scol, A.scol, B.at + n * B.scol + k0 * B.srow, B.srow,
                                     std::min(kCanonicalChunk, s.K - k0)));
        matmul_chunks_exact(s.M, s.N, s.K, acc, 0, A.at, A.srow, A.scol, B.at, B.srow, B.scol, Operands::kBf16);
        std::vector<float> got(static_cast<size_t>(s.M * s.N)), want_exact(got.size());
        acc.round_to(got.data());
        want_acc.round_to(want_exact.data());
        const auto re = verify::compare_exact(got.data(), want_exact.data(), s.M * s.N);
        ASSERT_TRUE(re.ok()) << re.summary("matmul_chunks_exact bf16, " + w);
      }
    }
  }
}

// Fast mode on bf16 operands: |C − A·B| within the fast-mode dot bound of fp32 plus VDPBF16PS's
// flushes (bounds::flush_to_zero_dot_bound), the exact product taken in double (its own rounding
// counted by the double dot bound).
TEST(MatmulBf16, FastWithinTheDotBoundPlusFlushes) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  ScopedIsa isa(Isa::kAvx512);
  ScopedBf16Kernel dots(Bf16Kernel::kDot);
  uint64_t seed = 100;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{9, 40, 77}, {40, 70, 4500}, {70, 33, 300}}) {
    for (int la = 0; la < test::kLayouts; la += 2) {
      // Spread normals, and rows and columns of tiny ones whose products fall below 2^-126 (there
      // the whole dot is flushed, far outside the dot bound alone); no inf or NaN.
      StridedMatrix A(M, K, la), B(K, N, (la + 1) % test::kLayouts);
      std::mt19937_64 g(seed++);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) A(i, k) = bf16_value(g, i % 4 == 1 ? 1 : 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) B(k, j) = bf16_value(g, j % 3 == 0 ? 2 : 0);
      std::vector<float> C(static_cast<size_t>(M * N), 1.0f);
      const float beta = la == 0 ? 0.0f : 1.0f;
      matmul_fast(M, N, K, 1.0f, A.at, A.srow, A.scol, B.at, B.srow, B.scol, beta, C.data(), N, Operands::kBf16);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double exact = beta, abs_products = 0, abs_operands = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double a = A(m, k), b = B(k, n);
            exact += a * b;
            abs_products += std::fabs(a * b);
            abs_operands += std::fabs(a) + std::fabs(b);
          }
          // beta·C adds one more term (and rounding) to the chain's bound.
          const double bound = bounds::dot_bound(K + 1, abs_products + beta) +
                               bounds::dot_bound(K + 1, abs_products + beta, bounds::kUnitF64) +
                               bounds::flush_to_zero_dot_bound(K, abs_operands);
          ASSERT_LE(std::fabs(C[m * N + n] - exact), bound)
              << "element (" << m << ", " << n << ") of M=" << M << " N=" << N << " K=" << K;
        }
      }
    }
  }
}

// A value that is not bf16 (its fp32 bits' low half not zero) means a rounding upstream is
// missing: the product says so instead of computing on truncated values.
TEST(MatmulBf16, OperandThatIsNotBf16IsAnError) {
  if (!bf16_dot_supported()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  ScopedIsa isa(Isa::kAvx512);
  ScopedBf16Kernel dots(Bf16Kernel::kDot);
  const int64_t M = 5, N = 40, K = 100;
  std::vector<float> A(M * K, 0.5f), B(K * N, 0.25f), C(M * N);
  B[17 * N + 3] = 0.1f;  // not a bf16 value
  EXPECT_THROW(matmul_canonical(M, N, K, C.data(), N, A.data(), K, 1, B.data(), N, 1, MatmulEpilogue{}, Operands::kBf16),
               InternalError);
  EXPECT_THROW(matmul_fast(M, N, K, 1.0f, A.data(), K, 1, B.data(), N, 1, 0.0f, C.data(), N, Operands::kBf16),
               InternalError);
  B[17 * N + 3] = 0.5f;
  EXPECT_NO_THROW(matmul_canonical(M, N, K, C.data(), N, A.data(), K, 1, B.data(), N, 1, MatmulEpilogue{},
                                   Operands::kBf16));
}

// Without AVX512-BF16, or with the fp32 kernels chosen, bf16 operands take the fp32 kernels: the
// same canonical bits as VDPBF16PS.
TEST(MatmulBf16, FmaKernelGivesTheSameCanonicalBits) {
  const Operands2 op(37, 90, 700, 0, 1, true, 9);
  const auto& A = op.A;
  const auto& B = op.B;
  const int64_t M = 37, N = 90, K = 700;
  const auto want = test::canonical_product_spec(M, N, K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
  ScopedBf16Kernel fma(Bf16Kernel::kFma);
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    std::vector<float> C(static_cast<size_t>(M * N));
    matmul_canonical(M, N, K, C.data(), N, A.at, A.srow, A.scol, B.at, B.srow, B.scol, MatmulEpilogue{}, Operands::kBf16);
    const auto r = verify::compare_exact(C.data(), want.data(), M * N);
    ASSERT_TRUE(r.ok()) << r.summary(std::string("fp32 kernels on bf16 operands, ") + std::string(isa_name(isa)));
  }
  EXPECT_EQ(active_bf16_kernel(), Bf16Kernel::kFma);
}

// LinearShape::round_outputs: the product and the input gradient equal the unrounded op's rounded
// afterwards, bit for bit, in both modes, on every kernel that can run them (fused into
// matmul_fast's stores; a pass after OpenBLAS; the canonical product's epilogue).
TEST(MatmulBf16, RoundedOutputsEqualTheProductRoundedAfter) {
  const LinearShape base{70, 4500, 130};  // the forward's K = 4500 runs in K blocks
  std::mt19937_64 g(3);
  std::vector<float> inp(base.N * base.IC), w(base.OC * base.IC), b(base.OC), dout(base.N * base.OC);
  for (auto* v : {&inp, &w, &b, &dout})
    for (auto& x : *v) x = bf16(test::random_value(g));
  std::vector<Bf16Kernel> kernels = {Bf16Kernel::kFma};
  if (bf16_dot_supported()) kernels.push_back(Bf16Kernel::kDot);
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (Bf16Kernel k : kernels) {
      for (FastGemm gemm : {FastGemm::kOpenBlas, FastGemm::kLockstep}) {
        ScopedBf16Kernel scoped(k);
        set_fast_gemm(gemm);
        LinearShape s = base;
        s.operands = Operands::kBf16;
        std::vector<float> want(base.N * base.OC), got(want.size()), want_dx(inp.size()), got_dx(inp.size());
        linear_forward(mode, s, want.data(), inp.data(), w.data(), b.data());
        round_to_bf16(static_cast<int64_t>(want.size()), want.data(), want.data());
        linear_backward(mode, s, 0, want_dx.data(), {}, {}, dout.data(), inp.data(), w.data());
        round_to_bf16(static_cast<int64_t>(want_dx.size()), want_dx.data(), want_dx.data());
        s.round_outputs = true;
        linear_forward(mode, s, got.data(), inp.data(), w.data(), b.data());
        linear_backward(mode, s, 0, got_dx.data(), {}, {}, dout.data(), inp.data(), w.data());
        const std::string where = std::string(mode_name(mode)) + (k == Bf16Kernel::kDot ? " VDPBF16PS" : " FMA") +
                                  (gemm == FastGemm::kOpenBlas ? " OpenBLAS" : " Lockstep");
        const auto r = verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(want.size()));
        ASSERT_TRUE(r.ok()) << r.summary("out, " + where);
        const auto rx = verify::compare_exact(got_dx.data(), want_dx.data(), static_cast<int64_t>(want_dx.size()));
        ASSERT_TRUE(rx.ok()) << rx.summary("dinp, " + where);
      }
    }
  }
  set_fast_gemm(FastGemm::kAuto);
}

// LinearShape::round_dout and round_weight: the ops of a bf16 linear that read an fp32 operand
// rounded to bf16 — its output gradient, or its master weight — give the bits of the same ops on a
// rounded copy — out, dinp, dweight, dbias and the tensor-parallel partials — in both modes, on
// every kernel (fast mode's VDPBF16PS products round it as they pack it, on every packing: row by
// row, k-major panels, transposed), and on 1 and 2 threads. The operand holds values bf16 cannot:
// an fp32 subnormal (which the packing flushes and the rounded copy keeps as a bf16 subnormal,
// flushed by VDPBF16PS), values that round up to infinity, ±0, inf, the default NaN — not the two
// cases matmul.hpp names, whose bits differ within fast mode's bound.
void expect_read_rounded_equals_rounded_copy(bool weight_operand) {
  std::vector<Bf16Kernel> kernels = {Bf16Kernel::kFma};
  if (bf16_dot_supported()) kernels.push_back(Bf16Kernel::kDot);
  // (N, IC, OC): dinp's A row by row (K = OC long, N <= 16 B panels) and as k-major panels; dW's A
  // is doutᵀ (K = tokens).
  for (const LinearShape base : {LinearShape{130, 96, 200}, LinearShape{70, 600, 90}}) {
    std::mt19937_64 g(11);
    std::vector<float> inp(base.N * base.IC), w(base.OC * base.IC), b(base.OC), dout(base.N * base.OC);
    for (auto* v : {&inp, &w, &b, &dout})
      for (auto& x : *v) x = bf16(test::random_value(g));
    std::vector<float>& raw = weight_operand ? w : dout;
    for (auto& x : raw) x = test::random_value(g);
    raw[1] = std::ldexp(1.0f, -130) * 1.3f;   // an fp32 subnormal
    raw[2] = 3.3961e38f;                       // above bf16's largest finite: rounds to inf
    raw[3] = -0.0f;
    raw[base.OC + 5] = std::numeric_limits<float>::quiet_NaN();
    raw[2 * base.OC + 7] = -std::numeric_limits<float>::infinity();
    std::vector<float> rounded(raw.size());
    round_to_bf16(static_cast<int64_t>(raw.size()), rounded.data(), raw.data());
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      for (Bf16Kernel k : kernels) {
        for (FastGemm gemm : {FastGemm::kOpenBlas, FastGemm::kLockstep}) {
          for (int threads : {1, 2}) {
            ScopedBf16Kernel scoped(k);
            ScopedThreads team(threads);
            set_fast_gemm(gemm);
            LinearShape s = base;
            s.operands = Operands::kBf16;
            s.round_outputs = true;
            // The ops on the operand itself (rounded as read) and on the rounded copy; each result
            // as floats.
            const auto run = [&](LinearShape shape, const float* grad, const float* weight) {
              std::vector<float> out(base.N * base.OC), dx(inp.size()), dw(w.size(), 0.25f), db(b.size(), 0.5f);
              std::vector<float> out_partials(out.size()), dx_partials(inp.size());
              linear_forward(mode, shape, out.data(), inp.data(), weight, b.data());
              if (mode == Mode::kCanonical) {
                ExactAccumulator acc_w(w.size()), acc_b(b.size()), acc_x(inp.size()), acc_o(out.size());
                linear_backward(mode, shape, 0, dx.data(), {.exact = &acc_w}, {.exact = &acc_b}, grad, inp.data(),
                                weight);
                const LinearShape part = unrounded(shape);
                linear_forward_partials(part, acc_o, inp.data(), weight);
                linear_backward_dinp_partials(part, acc_x, grad, weight);
                acc_w.round_to(dw.data());
                acc_b.round_to(db.data());
                acc_o.round_to(out_partials.data());
                acc_x.round_to(dx_partials.data());
              } else {
                linear_backward(mode, shape, 0, dx.data(), {.f32 = dw.data()}, {.f32 = db.data()}, grad, inp.data(),
                                weight);
              }
              return std::vector<std::vector<float>>{out, dx, dw, db, out_partials, dx_partials};
            };
            LinearShape fused = s;
            (weight_operand ? fused.round_weight : fused.round_dout) = true;
            const auto got = run(fused, dout.data(), w.data());
            const auto want = weight_operand ? run(s, dout.data(), rounded.data()) : run(s, rounded.data(), w.data());
            const std::string where = std::string(weight_operand ? "weight " : "dout ") + std::string(mode_name(mode)) +
                                      (k == Bf16Kernel::kDot ? " VDPBF16PS" : " FMA") +
                                      (gemm == FastGemm::kOpenBlas ? " OpenBLAS" : " Lockstep") + " threads " +
                                      std::to_string(threads) + " N=" + std::to_string(base.N);
            const char* names[] = {"out", "dinp", "dweight", "dbias", "out partials", "dinp partials"};
            for (size_t t = 0; t < got.size(); ++t) {
              ASSERT_EQ(0, std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)))
                  << names[t] << " differs, " << where;
            }
          }
        }
      }
    }
  }
  set_fast_gemm(FastGemm::kAuto);
}

TEST(MatmulBf16, OutputGradientRoundedAsReadEqualsTheOpOnItsRoundedCopy) {
  expect_read_rounded_equals_rounded_copy(false);
}

TEST(MatmulBf16, MasterWeightRoundedAsReadEqualsTheOpOnItsRoundedCopy) {
  expect_read_rounded_equals_rounded_copy(true);
}

// choose_gemms takes the faster candidate of a measurement where the choice is left to kAuto, and
// leaves a choice set by hand; measuring does not fix the choice.
TEST(MatmulBf16, ChoiceFollowsTheMeasurement) {
  ScopedBf16Kernel restore(Bf16Kernel::kAuto);
  GemmPeak peak;
  peak.openblas_gflops = 100;
  peak.fast_gflops = 200;
  peak.bf16_dot_gflops = 150;
  choose_gemms(peak);
  EXPECT_EQ(active_bf16_kernel(), Bf16Kernel::kFma);
  EXPECT_EQ(active_fast_gemm(), FastGemm::kLockstep);
  if (bf16_dot_supported() && active_isa() == Isa::kAvx512) {
    set_bf16_kernel(Bf16Kernel::kAuto);
    set_fast_gemm(FastGemm::kAuto);
    peak.bf16_dot_gflops = 400;
    peak.openblas_gflops = 300;
    choose_gemms(peak);
    EXPECT_EQ(active_bf16_kernel(), Bf16Kernel::kDot);
    EXPECT_EQ(active_fast_gemm(), FastGemm::kOpenBlas);
    set_bf16_kernel(Bf16Kernel::kAuto);
    (void)measure_gemm_peak();
    EXPECT_EQ(bf16_kernel_setting(), Bf16Kernel::kAuto);
  }
  set_bf16_kernel(Bf16Kernel::kFma);  // by hand: a measurement does not change it
  peak.bf16_dot_gflops = 1000;
  choose_gemms(peak);
  EXPECT_EQ(active_bf16_kernel(), Bf16Kernel::kFma);
  set_fast_gemm(FastGemm::kAuto);
}

}  // namespace
}  // namespace lockstep::cpu
