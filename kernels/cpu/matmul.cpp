// Dispatch of the canonical matrix products (matmul.hpp, kernels/ops/linear.hpp) and of
// matmul_fast to the SIMD kernel of the active ISA (or, for bf16 operands, the VDPBF16PS build),
// the choice of that bf16 kernel, and argument checks done once per call.
#include <atomic>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul_isa.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/cpu/matmul.hpp"
#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

std::atomic<Bf16Kernel> g_bf16_kernel{Bf16Kernel::kAuto};

// Whether a product of these operands runs the pair-packed VDPBF16PS build.
bool use_dots(Operands operands) {
  return operands == Operands::kBf16 && active_bf16_kernel() == Bf16Kernel::kDot;
}

}  // namespace

bool bf16_dot_supported() {
  __builtin_cpu_init();
  return isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
}

void set_bf16_kernel(Bf16Kernel kernel) {
  LS_REQUIRE(kernel != Bf16Kernel::kDot || bf16_dot_supported(),
             "the bf16 kernel VDPBF16PS needs AVX-512 with AVX512-BF16, which this CPU lacks");
  g_bf16_kernel.store(kernel);
}

Bf16Kernel bf16_kernel_setting() { return g_bf16_kernel.load(); }

Bf16Kernel active_bf16_kernel() {
  const Bf16Kernel k = g_bf16_kernel.load();
  if (k == Bf16Kernel::kFma || active_isa() != Isa::kAvx512) return Bf16Kernel::kFma;
  return k == Bf16Kernel::kDot || bf16_dot_supported() ? Bf16Kernel::kDot : Bf16Kernel::kFma;
}

std::string bf16_kernel_name() {
  if (active_bf16_kernel() == Bf16Kernel::kDot) return "VDPBF16PS (avx512bf16)";
  return "fp32 FMA (" + std::string(isa_name(active_isa())) + ")";
}

void matmul_canonical(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc, const float* A,
                      int64_t sam, int64_t sak, const float* B, int64_t sbk, int64_t sbn,
                      MatmulEpilogue epilogue, Operands operands) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_canonical: M=", M, " N=", N, " K=", K);
  LS_CHECK(M <= 1 || ldc >= N, "matmul_canonical: ldc=", ldc, " < N=", N);
  if (use_dots(operands)) {
    avx512bf16::matmul_canonical_packed(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn, epilogue);
  } else if (active_isa() == Isa::kAvx512) {
    avx512::matmul_canonical_packed(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn, epilogue);
  } else {
    avx2::matmul_canonical_packed(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn, epilogue);
  }
}

void matmul_canonical(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc, const float* A,
                      int64_t sam, int64_t sak, const float* B, int64_t sbk, int64_t sbn) {
  matmul_canonical(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn, MatmulEpilogue{});
}

void matmul_chunk_partials(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,
                           const float* A, int64_t sam, int64_t sak, const float* B, int64_t sbk,
                           int64_t sbn) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0 && K <= kCanonicalChunk, "matmul_chunk_partials: M=", M,
           " N=", N, " K=", K, " (K must be at most ", kCanonicalChunk, ")");
  LS_CHECK(M <= 1 || ldc >= N, "matmul_chunk_partials: ldc=", ldc, " < N=", N);
  if (active_isa() == Isa::kAvx512) {
    avx512::matmul_chunk_partials_packed(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn);
  } else {
    avx2::matmul_chunk_partials_packed(M, N, K, C, ldc, A, sam, sak, B, sbk, sbn);
  }
}

void matmul_chunks_exact(int64_t M, int64_t N, int64_t K, ExactAccumulator& acc, int64_t offset,
                         const float* A, int64_t sam, int64_t sak, const float* B, int64_t sbk,
                         int64_t sbn, Operands operands) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_chunks_exact: M=", M, " N=", N, " K=", K);
  LS_CHECK(offset >= 0 && static_cast<size_t>(offset + M * N) <= acc.size(),
           "matmul_chunks_exact: elements [", offset, ", ", offset + M * N,
           ") lie outside the accumulator of ", acc.size());
  if (use_dots(operands)) {
    avx512bf16::matmul_chunks_exact_packed(M, N, K, acc, offset, A, sam, sak, B, sbk, sbn);
  } else if (active_isa() == Isa::kAvx512) {
    avx512::matmul_chunks_exact_packed(M, N, K, acc, offset, A, sam, sak, B, sbk, sbn);
  } else {
    avx2::matmul_chunks_exact_packed(M, N, K, acc, offset, A, sam, sak, B, sbk, sbn);
  }
}

void matmul_fast(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t sam, int64_t sak,
                 const float* B, int64_t sbk, int64_t sbn, float beta, float* C, int64_t ldc, Operands operands,
                 MatmulEpilogue epilogue, RoundAsPacked rounds) {
  LS_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_fast: M=", M, " N=", N, " K=", K);
  LS_CHECK(!rounds.any() || matmul_fast_rounds_as_packed(operands),
           "matmul_fast: rounding as packed needs the VDPBF16PS build");
  if (use_dots(operands)) {
    avx512bf16::matmul_fast_packed(M, N, K, alpha, A, sam, sak, B, sbk, sbn, beta, C, ldc, epilogue, rounds);
  } else if (active_isa() == Isa::kAvx512) {
    avx512::matmul_fast_packed(M, N, K, alpha, A, sam, sak, B, sbk, sbn, beta, C, ldc, epilogue, {});
  } else {
    avx2::matmul_fast_packed(M, N, K, alpha, A, sam, sak, B, sbk, sbn, beta, C, ldc, epilogue, {});
  }
}

bool matmul_fast_rounds_as_packed(Operands operands) { return use_dots(operands); }

void release_packing_scratch() {
  if (bf16_dot_supported()) avx512bf16::release_packing_scratch();
  if (isa_supported(Isa::kAvx512)) avx512::release_packing_scratch();
  avx2::release_packing_scratch();
}

}  // namespace lockstep::cpu
