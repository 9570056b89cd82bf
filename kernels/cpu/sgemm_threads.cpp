// OpenBLAS sgemm on the kernels' OpenMP threads (see sgemm_threads.hpp for why).
#include "kernels/cpu/sgemm_threads.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

namespace lockstep::cpu {
namespace {

// Slices are multiples of this many rows or columns, so that every slice but the last fills
// OpenBLAS's register blocks (16 or fewer wide on AVX-512 and AVX2).
constexpr int64_t kSliceAlign = 64;

}  // namespace

BlasSerial::BlasSerial() : threads_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
BlasSerial::~BlasSerial() { openblas_set_num_threads(threads_); }

void sgemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

void sgemm_threads(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
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
