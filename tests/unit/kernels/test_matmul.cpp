// Tests of the canonical matrix products (kernels/cpu/matmul.hpp, matmul_canonical of
// kernels/ops/linear.hpp): every element must equal the scalar specification canonical_dot bit for
// bit — for odd, prime and chunk-edge shapes, every stride layout, adversarial values (±0,
// subnormals, overflow inside a chunk, inf/NaN, magnitudes that make the double combination
// inexact), on AVX2 and AVX-512 and for 1, 2 and 3 threads.
#include <gtest/gtest.h>
#include <omp.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/linear.hpp"
#include "src/core/check.hpp"
#include "src/core/formats.hpp"
#include "tests/support/random_values.hpp"
#include "tests/unit/kernels/matrix_util.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::cpu {
namespace {

using test::StridedMatrix;

std::vector<Isa> supported_isas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) v.push_back(isa);
  }
  return v;
}

// Restores OpenMP's thread count after a test changes it.
struct ScopedThreads {
  int previous = omp_get_max_threads();
  explicit ScopedThreads(int n) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous); }
};

struct Case {
  int64_t M, N, K;
  int a_layout, b_layout;
  bool special;
  uint64_t seed;
  std::string name() const {
    std::ostringstream os;
    os << "M=" << M << " N=" << N << " K=" << K << " A layout " << a_layout << " B layout "
       << b_layout << (special ? " special values" : "") << " seed " << seed;
    return os.str();
  }
};

// A (M x K) then B (K x N), row by row, from the case's seed: special values or spread normals.
void fill_operands(const Case& c, StridedMatrix& A, StridedMatrix& B) {
  std::mt19937_64 g(c.seed);
  auto value = [&] { return c.special ? test::special_value(g) : test::random_value(g); };
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t k = 0; k < c.K; ++k) A(i, k) = value();
  for (int64_t k = 0; k < c.K; ++k)
    for (int64_t j = 0; j < c.N; ++j) B(k, j) = value();
}

// Runs matmul_canonical on the case and compares with the scalar specification; C is written
// with a padded row stride whose padding must stay untouched.
verify::CompareReport run_case(const Case& c) {
  StridedMatrix A(c.M, c.K, c.a_layout), B(c.K, c.N, c.b_layout);
  fill_operands(c, A, B);
  const int64_t ldc = c.N + 2;
  constexpr float kSentinel = 12345.0f;
  std::vector<float> C(static_cast<size_t>(c.M * ldc), kSentinel);
  matmul_canonical(c.M, c.N, c.K, C.data(), ldc, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
  const auto want =
      test::canonical_product_spec(c.M, c.N, c.K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
  std::vector<float> got(static_cast<size_t>(c.M * c.N));
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) got[m * c.N + n] = C[m * ldc + n];
    for (int64_t n = c.N; n < ldc; ++n) EXPECT_EQ(C[m * ldc + n], kSentinel) << "padding written";
  }
  return verify::compare_exact(got.data(), want.data(), c.M * c.N);
}

TEST(MatmulCanonical, EqualsCanonicalDotAcrossShapesAndLayouts) {
  const int64_t dims[] = {1, 2, 5, 7, 13, 17, 31, 33};
  const int64_t ks[] = {0, 1, 3, 63, 64, 65, 127, 128, 129, 200, 1000, 2100};
  uint64_t seed = 1;
  int cases = 0;
  for (int64_t K : ks) {
    for (int64_t M : dims) {
      // N cycles through dims (and one wide value) so every (M, K) pair meets varied N.
      const int64_t N = (M * 7 + K) % 3 == 0 ? 37 : dims[(M + K) % 8];
      const Case c{M, N, K, static_cast<int>(seed % test::kLayouts),
                   static_cast<int>((seed / 3) % test::kLayouts), false, seed};
      ++seed;
      const auto r = run_case(c);
      ASSERT_TRUE(r.ok()) << r.summary(c.name());
      ++cases;
    }
  }
  // Every pair of layouts once at a chunk-crossing shape.
  for (int la = 0; la < test::kLayouts; ++la) {
    for (int lb = 0; lb < test::kLayouts; ++lb) {
      const Case c{19, 35, 130, la, lb, false, seed++};
      const auto r = run_case(c);
      ASSERT_TRUE(r.ok()) << r.summary(c.name());
      ++cases;
    }
  }
  RecordProperty("cases", cases);
}

TEST(MatmulCanonical, EqualsCanonicalDotOnSpecialValues) {
  uint64_t seed = 1000;
  for (int64_t K : {1, 2, 64, 65, 130, 300}) {
    for (int rep = 0; rep < 4; ++rep) {
      const Case c{11, 29, K, rep % test::kLayouts, (rep + 1) % test::kLayouts, true, seed++};
      const auto r = run_case(c);
      ASSERT_TRUE(r.ok()) << r.summary(c.name());
    }
  }
}

// Chunk partials 2^±100 apart: their exact sum needs more than 53 bits, so the vector path must
// notice and recompute with the specification (which spills to the SuperAccumulator). The
// expected result is computed independently: the chunks' exact values are known.
TEST(MatmulCanonical, InexactDoubleCombinationFallsBackExactly) {
  const int64_t K = 3 * kCanonicalChunk, M = 3, N = 20;
  std::vector<float> A(M * K, 0.0f), B(K * N, 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    A[m * K + 0] = std::ldexp(1.0f, 100);                     // chunk 0: 2^100
    A[m * K + kCanonicalChunk] = 1.0f;                        // chunk 1: 1 (lost in a double)
    A[m * K + 2 * kCanonicalChunk] = -std::ldexp(1.0f, 100);  // chunk 2: −2^100
  }
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) B[k * N + n] = 1.0f;
  }
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    std::vector<float> C(M * N);
    matmul_canonical(M, N, K, C.data(), N, A.data(), K, 1, B.data(), N, 1);
    for (float v : C) ASSERT_EQ(v, 1.0f) << isa_name(isa);  // a double sum would give 0
  }
}

// The vector kernel keeps a chunk-combined double sum only where a sufficient test proves it exact
// (matmul.isa.cpp); everywhere else it must recompute with the specification. Row s of A makes the
// chunk partials p1 = (2^24−1)·2^(s+e0), p2 = 2^e0·(1 + n/64) (B's column n), p3 = −p1 — the last
// in a short chunk (K = 133) — so the exact sum is p2 while the running double sum p1 + p2 needs
// about s + 30 bits: exact for small s, rounded (and the double result then wrong) from s ≈ 24 on.
// e0 = −143 makes p2 subnormal in fp32. Extra rows have a zero middle chunk (exact sum +0) or
// only zero chunks. Expected values are known exactly, and must also equal canonical_dot.
void fill_window_case(int64_t rows_s, int e0, StridedMatrix& A, StridedMatrix& B) {
  const int64_t K = A.cols, N = B.cols;
  for (int64_t m = 0; m < A.rows; ++m)
    for (int64_t k = 0; k < K; ++k) A(m, k) = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) B(k, n) = k == kCanonicalChunk ? 1.0f + static_cast<float>(n) / 64 : 1.0f;
  for (int64_t m = 0; m < A.rows; ++m) {
    const int64_t s = m % rows_s;
    const float big = std::ldexp(static_cast<float>((1 << 24) - 1), static_cast<int>(s) + e0);
    const bool zero_middle = m >= rows_s, all_zero = m >= 2 * rows_s;
    if (all_zero) continue;
    A(m, 0) = big;
    A(m, kCanonicalChunk) = zero_middle ? 0.0f : std::ldexp(1.0f, e0);
    A(m, 2 * kCanonicalChunk) = -big;
  }
}

TEST(MatmulCanonical, DoubleCombinationExactOrRecomputedAtTheWindowEdge) {
  const int64_t S = 64, M = 2 * S + 3, N = 37, K = 2 * kCanonicalChunk + 5;
  for (int e0 : {0, -143}) {
    for (int layout = 0; layout < 2; ++layout) {
      StridedMatrix A(M, K, layout), B(K, N, 1 - layout);
      fill_window_case(S, e0, A, B);
      std::vector<float> want(M * N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          want[m * N + n] = m < S ? std::ldexp(1.0f + static_cast<float>(n) / 64, e0) : 0.0f;
      const auto spec =
          test::canonical_product_spec(M, N, K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
      const std::string what = "e0 " + std::to_string(e0) + " layout " + std::to_string(layout);
      const auto rs = verify::compare_exact(spec.data(), want.data(), M * N);
      ASSERT_TRUE(rs.ok()) << rs.summary("specification, " + what);
      for (Isa isa : supported_isas()) {
        for (int threads : {1, 2}) {
          ScopedIsa scope(isa);
          ScopedThreads t(threads);
          const std::string where = what + " isa " + std::string(isa_name(isa)) + " threads " +
                                    std::to_string(threads);
          std::vector<float> C(M * N);
          matmul_canonical(M, N, K, C.data(), N, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
          const auto r = verify::compare_exact(C.data(), want.data(), M * N);
          ASSERT_TRUE(r.ok()) << r.summary("matmul_canonical, " + where);
          ExactAccumulator acc(M * N);
          matmul_chunks_exact(M, N, K, acc, 0, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
          std::vector<float> got(M * N);
          acc.round_to(got.data());
          const auto re = verify::compare_exact(got.data(), want.data(), M * N);
          ASSERT_TRUE(re.ok()) << re.summary("matmul_chunks_exact, " + where);
        }
      }
    }
  }
}

// The case's product on every ISA at each thread count equals the scalar specification bitwise;
// false (and a failure naming the first mismatch) otherwise.
bool bitwise_on_every_isa(const Case& c, std::initializer_list<int> thread_counts) {
  StridedMatrix A(c.M, c.K, c.a_layout), B(c.K, c.N, c.b_layout);
  fill_operands(c, A, B);
  const auto want =
      test::canonical_product_spec(c.M, c.N, c.K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
  for (Isa isa : supported_isas()) {
    for (int threads : thread_counts) {
      ScopedIsa scope(isa);
      ScopedThreads t(threads);
      std::vector<float> C(c.M * c.N);
      matmul_canonical(c.M, c.N, c.K, C.data(), c.N, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
      const auto r = verify::compare_exact(C.data(), want.data(), c.M * c.N);
      if (!r.ok()) {
        ADD_FAILURE() << r.summary(c.name() + " isa " + std::string(isa_name(isa)) + " threads " +
                                   std::to_string(threads));
        return false;
      }
    }
  }
  return true;
}

TEST(MatmulCanonical, BitwiseAcrossIsasAndThreadCounts) {
  // K = 5000: K blocks of 2048 (the last one short) whose sums carry from block to block.
  const Case shapes[] = {{67, 45, 1000, 0, 1, false, 7}, {130, 77, 129, 2, 0, false, 8},
                         {25, 50, 200, 1, 3, true, 9}, {29, 70, 5000, 1, 2, true, 10}};
  for (const Case& c : shapes) ASSERT_TRUE(bitwise_on_every_isa(c, {1, 2, 3}));
}

// A whose rows are contiguous, against few B panels, is packed row by row (matmul.isa.cpp): one
// short K block, one long one and several short ones, an edge micro-panel, rows plain, padded and
// reversed (layouts 0, 2, 4), on every ISA and 1 and 2 threads.
TEST(MatmulCanonical, RowByRowAMicroPanelsEqualCanonicalDot) {
  uint64_t seed = 500;
  for (int64_t K : {700, 3000, 5000}) {
    for (int a_layout : {0, 2, 4}) {
      const Case c{30, K > 1000 ? 40 : 300, K, a_layout, static_cast<int>(seed % 2), false, seed};
      ++seed;
      ASSERT_TRUE(bitwise_on_every_isa(c, {1, 2}));
    }
  }
}

// The bias is added after the rounding, and C's previous contents are overwritten.
TEST(MatmulCanonical, EpilogueAddsBiasAfterRounding) {
  const int64_t M = 9, N = 40, K = 150;
  std::mt19937_64 g(42);
  std::vector<float> A(M * K), B(K * N), bias(N), C(M * N);
  for (auto& x : A) x = test::random_value(g);
  for (auto& x : B) x = test::random_value(g);
  for (auto& x : bias) x = test::random_value(g);
  for (auto& x : C) x = test::random_value(g);
  const auto dot = test::canonical_product_spec(M, N, K, A.data(), K, 1, B.data(), N, 1);
  std::vector<float> want(M * N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) want[m * N + n] = dot[m * N + n] + bias[n];
  }
  MatmulEpilogue ep;
  ep.col_bias = bias.data();
  matmul_canonical(M, N, K, C.data(), N, A.data(), K, 1, B.data(), N, 1, ep);
  const auto r = verify::compare_exact(C.data(), want.data(), M * N);
  ASSERT_TRUE(r.ok()) << r.summary("bias epilogue");
}

// With round_bf16 the epilogue's result is rounded to bf16 after the bias, as formats.hpp rounds
// (nearest even, NaN quieted with its sign, overflow to inf): on every path a tile's element can
// take — the vector stores of exact sums, the scalar specification of inexact or non-finite ones, a
// single chunk — on each ISA and thread count. The bias reaches bf16's overflow threshold.
TEST(MatmulCanonical, EpilogueRoundsToBf16AfterTheBias) {
  std::mt19937_64 g(17);
  for (int64_t K : {int64_t{17}, int64_t{150}, int64_t{1100}}) {
    for (bool special : {false, true}) {
      const int64_t M = 23, N = 45;
      std::vector<float> A(M * K), B(K * N), bias(N);
      for (auto& x : A) x = special && g() % 8 == 0 ? test::special_value(g) : test::random_value(g);
      for (auto& x : B) x = test::random_value(g);
      for (auto& x : bias) x = g() % 4 == 0 ? std::ldexp(test::random_value(g), 127) : test::random_value(g);
      const auto dot = test::canonical_product_spec(M, N, K, A.data(), K, 1, B.data(), N, 1);
      std::vector<float> want(M * N);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) want[m * N + n] = bf16_to_f32(bf16_from_f32(dot[m * N + n] + bias[n]));
      }
      MatmulEpilogue ep;
      ep.col_bias = bias.data();
      ep.round_bf16 = true;
      for (Isa isa : supported_isas()) {
        ScopedIsa scope(isa);
        for (int threads : {1, 3}) {
          ScopedThreads t(threads);
          std::vector<float> C(M * N);
          matmul_canonical(M, N, K, C.data(), N, A.data(), K, 1, B.data(), N, 1, ep);
          const auto r = verify::compare_exact(C.data(), want.data(), M * N);
          ASSERT_TRUE(r.ok()) << r.summary("bf16 epilogue, K=" + std::to_string(K) + (special ? " special" : "") +
                                           " " + std::string(isa_name(isa)) + " threads " + std::to_string(threads));
        }
      }
    }
  }
}

TEST(MatmulChunkPartials, EqualsChunkDot) {
  std::mt19937_64 g(5);
  for (int64_t K : {0, 1, 17, 63, 64}) {
    for (int layout = 0; layout < test::kLayouts; ++layout) {
      const int64_t M = 13, N = 38;
      StridedMatrix A(M, K, layout), B(K, N, (layout + 2) % test::kLayouts);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) A(i, k) = test::special_value(g);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) B(k, j) = test::special_value(g);
      std::vector<float> want(M * N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) want[m * N + n] = chunk_dot(A.at + m * A.srow, A.scol, B.at + n * B.scol, B.srow, K);
      for (Isa isa : supported_isas()) {
        ScopedIsa scope(isa);
        std::vector<float> C(M * N);
        matmul_chunk_partials(M, N, K, C.data(), N, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
        const auto r = verify::compare_exact(C.data(), want.data(), M * N);
        ASSERT_TRUE(r.ok()) << r.summary("K=" + std::to_string(K) + " layout " + std::to_string(layout));
      }
    }
  }
  std::vector<float> dummy(4);
  EXPECT_THROW(matmul_chunk_partials(1, 1, kCanonicalChunk + 1, dummy.data(), 1, dummy.data(), 1, 1,
                                     dummy.data(), 1, 1),
               InternalError);
}

// Adding each chunk partial one by one (the contract) and adding the kernel's exact per-call sums
// must leave the same rounded value, including elements that spill or meet inf/NaN.
TEST(MatmulChunksExact, EqualsChunkByChunkAccumulation) {
  std::mt19937_64 g(77);
  const int64_t M = 14, N = 33;
  for (const auto& [K, special] : {std::pair<int64_t, bool>{250, false}, {250, true}, {3000, false}, {3000, true}}) {
    std::vector<float> A(M * K), B(K * N);
    for (auto& x : A) x = special ? test::special_value(g) : test::random_value(g, 40);
    for (auto& x : B) x = special ? test::special_value(g) : test::random_value(g, 40);
    const int64_t offset = 5;
    ExactAccumulator want_acc(offset + M * N);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k0 = 0; k0 < K; k0 += kCanonicalChunk)
          want_acc.add(offset + m * N + n, chunk_dot(&A[m * K + k0], 1, &B[k0 * N + n], N, std::min(kCanonicalChunk, K - k0)));
    std::vector<float> want(offset + M * N);
    want_acc.round_to(want.data());
    for (Isa isa : supported_isas()) {
      ScopedIsa scope(isa);
      ExactAccumulator acc(offset + M * N);
      matmul_chunks_exact(M, N, K, acc, offset, A.data(), K, 1, B.data(), N, 1);
      std::vector<float> got(offset + M * N);
      acc.round_to(got.data());
      const auto r = verify::compare_exact(got.data(), want.data(), offset + M * N);
      ASSERT_TRUE(r.ok()) << r.summary(std::string(isa_name(isa)) + " K " + std::to_string(K) + (special ? " special" : ""));
    }
  }
}

// Property: for random shapes, layouts and values (normal, wide-range or adversarial), on every
// supported ISA, matmul_canonical equals the scalar specification bit for bit.
RC_GTEST_PROP(MatmulCanonical, PropertyEqualsCanonicalDotSpec, ()) {
  const auto M = *rc::gen::inRange<int64_t>(1, 30);
  const auto N = *rc::gen::inRange<int64_t>(1, 45);
  const auto K = *rc::gen::inRange<int64_t>(0, 300);
  const auto a_layout = *rc::gen::inRange(0, test::kLayouts);
  const auto b_layout = *rc::gen::inRange(0, test::kLayouts);
  const auto values = *rc::gen::inRange(0, 3);  // 0 normal, 1 wide exponents, 2 special
  const auto seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 g(seed);
  auto value = [&] {
    return values == 2 ? test::special_value(g) : test::random_value(g, values == 1 ? 60 : 4);
  };
  StridedMatrix A(M, K, a_layout), B(K, N, b_layout);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) A(i, k) = value();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) B(k, j) = value();
  const auto want = test::canonical_product_spec(M, N, K, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
  for (Isa isa : supported_isas()) {
    ScopedIsa scope(isa);
    std::vector<float> C(M * N);
    matmul_canonical(M, N, K, C.data(), N, A.at, A.srow, A.scol, B.at, B.srow, B.scol);
    const auto r = verify::compare_exact(C.data(), want.data(), M * N);
    if (!r.ok()) {
      const Case c{M, N, K, a_layout, b_layout, values == 2, seed};
      RC_FAIL(r.summary(c.name() + " isa " + std::string(isa_name(isa))));
    }
  }
}

}  // namespace
}  // namespace lockstep::cpu
