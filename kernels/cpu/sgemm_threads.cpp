// Fast mode's GEMM: OpenBLAS sgemm on the kernels' OpenMP threads, or matmul_fast (see
// sgemm_threads.hpp for why and when).
#include "kernels/cpu/sgemm_threads.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <string_view>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/ops/cast.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

std::atomic<FastGemm> g_fast_gemm{FastGemm::kAuto};

// Whether OpenBLAS runs one of its AVX-512 sgemm kernels (the core names of OpenBLAS's
// DYNAMIC_ARCH targets that have them).
bool openblas_kernel_is_avx512() {
  static const bool avx512 = [] {
    const std::string_view core = openblas_get_corename();
    for (std::string_view name : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
      if (core.size() == name.size() &&
          std::equal(core.begin(), core.end(), name.begin(),
                     [](char a, char b) { return (a | 0x20) == (b | 0x20); })) {
        return true;
      }
    }
    return false;
  }();
  return avx512;
}

// Slices are multiples of this many rows or columns, so that every slice but the last fills
// OpenBLAS's register blocks (16 or fewer wide on AVX-512 and AVX2).
constexpr int64_t kSliceAlign = 64;

// The cblas_sgemm arguments as matmul_fast's: op(A) (M, K) and op(B) (K, N) as strides, a
// transposed operand read down its columns. Threads itself outside a parallel region.
void run_matmul_fast(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                     int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                     Operands operands = Operands::kFp32, MatmulEpilogue epilogue = {}, RoundAsPacked rounds = {}) {
  matmul_fast(M, N, K, alpha, A, trans_a ? 1 : lda, trans_a ? lda : 1, B, trans_b ? 1 : ldb,
              trans_b ? ldb : 1, beta, C, ldc, operands, epilogue, rounds);
}

}  // namespace

void set_fast_gemm(FastGemm choice) { g_fast_gemm.store(choice); }

FastGemm fast_gemm_setting() { return g_fast_gemm.load(); }

FastGemm active_fast_gemm() {
  const FastGemm choice = g_fast_gemm.load();
  if (choice != FastGemm::kAuto) return choice;
  const bool narrower = active_isa() == Isa::kAvx512 && !openblas_kernel_is_avx512();
  return narrower ? FastGemm::kLockstep : FastGemm::kOpenBlas;
}

std::string openblas_sgemm_name() { return std::string("OpenBLAS sgemm (") + openblas_get_corename() + ")"; }

std::string fast_gemm_name() {
  if (active_fast_gemm() == FastGemm::kOpenBlas) return openblas_sgemm_name();
  const std::string name = "Lockstep fast GEMM (" + std::string(isa_name(active_isa()));
  if (fast_gemm_setting() != FastGemm::kAuto) return name + ")";
  return name + "; OpenBLAS's kernel " + openblas_get_corename() +
         (openblas_kernel_is_avx512() ? " is AVX-512)" : " is not AVX-512)");
}

BlasSerial::BlasSerial() : threads_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
BlasSerial::~BlasSerial() { openblas_set_num_threads(threads_); }

void sgemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (active_fast_gemm() == FastGemm::kLockstep) {
    run_matmul_fast(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

void sgemm_threads(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                   Operands operands, MatmulEpilogue epilogue, RoundAsPacked rounds) {
  if (M == 0 || N == 0) return;
  if (rounds.any() || (operands == Operands::kBf16 && active_bf16_kernel() == Bf16Kernel::kDot) ||
      active_fast_gemm() == FastGemm::kLockstep) {
    run_matmul_fast(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, operands, epilogue, rounds);
    return;
  }
  // OpenBLAS has no epilogue: the bias goes into C first and is added with beta = 1 (the same
  // single addition per element as matmul_fast's), the rounding after the product.
  if (epilogue.col_bias != nullptr) {
    LS_CHECK(beta == 0.0f, "sgemm_threads: a bias epilogue needs beta = 0, got ", beta);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) std::copy(epilogue.col_bias, epilogue.col_bias + N, C + m * ldc);
    beta = 1.0f;
  }
  if (epilogue.round_bf16) {
    sgemm_threads(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (ldc == N) {
      round_to_bf16(M * N, C, C);
    } else {
      for (int64_t m = 0; m < M; ++m) round_to_bf16(N, C + m * ldc, C + m * ldc);
    }
    return;
  }
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? M : N;
  const int64_t units = (extent + kSliceAlign - 1) / kSliceAlign;
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), units);
  BlasSerial serial;
  if (threads <= 1) {
    sgemm_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(threads))
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t first = units * t / threads * kSliceAlign;
    const int64_t end = std::min(extent, units * (t + 1) / threads * kSliceAlign);
    if (first >= end) continue;
    if (split_rows) {
      // Rows [first, end) of C come from rows [first, end) of op(A).
      const float* a = trans_a ? A + first : A + first * lda;
      sgemm_serial(trans_a, trans_b, end - first, N, K, alpha, a, lda, B, ldb, beta, C + first * ldc, ldc);
    } else {
      // Columns [first, end) of C come from columns [first, end) of op(B).
      const float* b = trans_b ? B + first * ldb : B + first;
      sgemm_serial(trans_a, trans_b, M, end - first, K, alpha, A, lda, b, ldb, beta, C + first, ldc);
    }
  }
}

}  // namespace lockstep::cpu
