// Internal: fast mode's GEMM — OpenBLAS sgemm run on the kernels' OpenMP threads instead of
// OpenBLAS's own pool, or Lockstep's packed kernel where OpenBLAS's is narrower than the CPU.
//
// Debian links Lockstep to the pthread build of OpenBLAS, whose worker threads spin and yield
// between calls while the kernels' OpenMP threads spin between parallel regions: with both pools
// as wide as the cores, a two-thread step spent about half its cycles in the two spin loops
// (perf: libgomp's wait loop and sched_yield). So fast-mode kernels keep OpenBLAS single-threaded
// (BlasSerial) and split each product over OpenMP themselves (sgemm_threads). One pool of threads
// then runs the whole step.
// Fast mode only: the split changes no result a canonical kernel computes (canonical products run
// matmul.hpp), and fast mode promises its bounds, not bits across thread counts.
// Not here: the canonical products (matmul.hpp), which are threaded by their own tiles.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/matmul.hpp"
#include "kernels/ops/mode.hpp"

namespace lockstep::cpu {

// Which GEMM sgemm_threads runs. OpenBLAS picks its kernel for the CPU once, at load: Debian 12's
// OpenBLAS 0.3.21 takes its AVX2 (Haswell) kernel on AMD Zen 4 and 5, and OPENBLAS_CORETYPE can
// force one anywhere; on an AVX-512 CPU that halves the fast mode's products (it then ran slower
// than canonical mode). The trainer and the bench time both at start-up and take the faster
// (gemm_peak.hpp's choose_gemms); until then, or with the peak configured, kAuto is a rule:
// Lockstep's matmul_fast (matmul.hpp) when the kernels use AVX-512 and OpenBLAS's kernel does not,
// otherwise OpenBLAS.
enum class FastGemm { kAuto, kOpenBlas, kLockstep };

// Process-wide, like set_isa (kernels/cpu/isa.hpp); set before the step, outside parallel regions.
void set_fast_gemm(FastGemm choice);
// The GEMM sgemm_threads runs now (kAuto resolved against the active ISA: the rule that holds
// until a measurement chooses, gemm_peak.hpp's choose_gemms).
FastGemm active_fast_gemm();
// The choice as set (kAuto unresolved).
FastGemm fast_gemm_setting();
// OpenBLAS's sgemm with the kernel it runs: "OpenBLAS sgemm (SkylakeX)".
std::string openblas_sgemm_name();
// Names it for people: "OpenBLAS sgemm (SkylakeX)", "Lockstep fast GEMM (avx512)", and under the
// rule "Lockstep fast GEMM (avx512; OpenBLAS's kernel Haswell is not AVX-512)".
std::string fast_gemm_name();

// OpenBLAS runs single-threaded for the duration of a scope (the caller's threads already split
// the work). Construct outside parallel regions: the setting is process-wide.
class BlasSerial {
 public:
  BlasSerial();
  ~BlasSerial();
  BlasSerial(const BlasSerial&) = delete;
  BlasSerial& operator=(const BlasSerial&) = delete;

 private:
  int threads_;
};

// C (M, N) = alpha·op(A)·op(B) + beta·C, row-major, op(X) = Xᵀ where trans_x; one single-threaded
// OpenBLAS call on the calling thread, or matmul_fast (active_fast_gemm()), which runs on the
// calling thread inside a parallel region.
void sgemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same product on the OpenMP threads: with OpenBLAS each thread takes a contiguous slice of
// the rows of C or of its columns (whichever dimension is longer, in multiples of 64), each slice
// one single-threaded OpenBLAS call; matmul_fast splits its tiles itself. Bf16 operands run
// matmul_fast's VDPBF16PS kernel where active_bf16_kernel() is kDot. The epilogue (matmul.hpp):
// a column bias added to the product (needs beta 0 under OpenBLAS, which gets it as C's start),
// and C rounded to bf16 (kernels/ops/cast.hpp) as matmul_fast stores it, or after OpenBLAS.
// rounds: op(A), op(B) rounded to bf16 as matmul_fast packs them (only where
// matmul_fast_rounds_as_packed). Call outside parallel regions.
void sgemm_threads(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                   Operands operands = Operands::kFp32, MatmulEpilogue epilogue = {}, RoundAsPacked rounds = {});

}  // namespace lockstep::cpu
