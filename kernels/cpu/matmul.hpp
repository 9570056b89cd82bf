// The canonical matrix product of the CPU kernels (linear, attention) and its variants:
//  - matmul_canonical: C[m,n] = canonical_dot over k of A[m*sam + k*sak] · B[k*sbk + n*sbn]
//    (overwrites C), with an optional epilogue (a column bias) applied after the single rounding,
//    so that out = dot + bias needs no temporary;
//  - the chunk partials of a reduction over "tokens": C = one fp32 FMA chain of K <= 64 terms per
//    element (no rounding step of its own), and matmul_chunks_exact, which cuts a longer K into
//    chunks of kCanonicalChunk and adds every chunk partial into an ExactAccumulator — the
//    canonical weight-gradient reduction.
// All of them dispatch on active_isa() and give the same bits on AVX2 and AVX-512 and for any
// thread count; with Operands::kBf16 they may run VDPBF16PS (Bf16Kernel below), the same bits
// again. Beside them, matmul_fast: fast mode's product on the same packed kernel where
// OpenBLAS's kernel is narrower than the CPU (sgemm_threads.hpp chooses).
// Not here: fast-mode OpenBLAS products, which callers invoke directly.
#pragma once

#include <cstdint>

#include <string>

#include "kernels/ops/mode.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep::cpu {

// The instructions of products whose operands are bf16 values (Operands::kBf16): kDot, VDPBF16PS on
// operands packed as bf16 pairs, where the CPU has AVX512-BF16 and the active ISA is AVX-512; kFma,
// the fp32 kernels of the active ISA. Canonical results are the same bits with either; fast mode's
// differ within its bound. The trainer and the bench time both at start-up and take the faster
// (gemm_peak.hpp's choose_gemms); until then kAuto resolves to kDot where the CPU can run it.
// Process-wide, like set_isa; set outside parallel regions.
enum class Bf16Kernel { kAuto, kFma, kDot };
bool bf16_dot_supported();
// Throws ConfigError for kDot where the CPU cannot run it.
void set_bf16_kernel(Bf16Kernel kernel);
Bf16Kernel active_bf16_kernel();
// The choice as set (kAuto unresolved).
Bf16Kernel bf16_kernel_setting();
// "VDPBF16PS (avx512bf16)" or the fp32 kernel's ISA: "fp32 FMA (avx2)".
std::string bf16_kernel_name();

// Applied to each element after the rounded canonical dot r: C = r (+ col_bias[n]), one fp32
// addition, then (round_bf16) that rounded to bf16 to nearest even as round_to_bf16 would
// (kernels/ops/cast.hpp): a bf16 linear's outputs, rounded as they are stored instead of in a pass
// over C afterwards.
struct MatmulEpilogue {
  const float* col_bias = nullptr;  // (N) or nullptr
  bool round_bf16 = false;
};

// A SIMD kernel: one FMA chain per output lane (kernels/ops/canonical.hpp's contract), so the bits
// do not depend on the vector width, the tiles or the threads.
void matmul_canonical(int64_t M, int64_t N, int64_t K,
                      float* C, int64_t ldc,                     // (M, N) row stride ldc
                      const float* A, int64_t sam, int64_t sak,  // (M, K) strides
                      const float* B, int64_t sbk, int64_t sbn,  // (K, N) strides
                      MatmulEpilogue epilogue, Operands operands = Operands::kFp32);
// The same without an epilogue.
void matmul_canonical(int64_t M, int64_t N, int64_t K,
                      float* C, int64_t ldc,                     // (M, N) row stride ldc
                      const float* A, int64_t sam, int64_t sak,  // (M, K) strides
                      const float* B, int64_t sbk, int64_t sbn); // (K, N) strides

// One canonical chunk: C[m,n] = chunk_dot over k in [0,K) (sequential fp32 FMA chain from +0.0f,
// increasing k), K <= kCanonicalChunk. Overwrites C.
void matmul_chunk_partials(int64_t M, int64_t N, int64_t K,
                           float* C, int64_t ldc,                     // (M, N)
                           const float* A, int64_t sam, int64_t sak,  // (M, K)
                           const float* B, int64_t sbk, int64_t sbn); // (K, N)

// Σ over k of A[m,k]·B[k,n] in chunks of kCanonicalChunk counted from k = 0 of this call; each
// chunk partial is added to acc at index offset + m*N + n (so the caller's k = 0 must sit on a
// global chunk boundary). The accumulator rounds once when read.
void matmul_chunks_exact(int64_t M, int64_t N, int64_t K,
                         ExactAccumulator& acc, int64_t offset,     // (M, N) elements from offset
                         const float* A, int64_t sam, int64_t sak,  // (M, K)
                         const float* B, int64_t sbk, int64_t sbn,  // (K, N)
                         Operands operands = Operands::kFp32);

// Which operands of matmul_fast hold fp32 values that the product reads rounded to bf16
// (round_to_bf16, kernels/ops/cast.hpp) as it packs them: a bf16 product whose operand is not
// stored in bf16 (a linear's output gradient, kept in fp32; its fp32 master weight, of which fast
// mode keeps no bf16 copy) without a rounded copy.
struct RoundAsPacked {
  bool a = false, b = false;
  bool any() const { return a || b; }
};

// Fast mode's product without OpenBLAS: C (M, N) = alpha·A·B + col_bias + beta·C (beta 0: C is not
// read), each element one fp32 FMA chain per K block of the packed kernel, the blocks added into C
// in order; the epilogue's bias is added to the first block's result (one addition, where copying
// the bias into C to add it with beta = 1 wrote and read C once more) and its rounding to bf16
// applies as the last block is stored. No canonical order: the accuracy of any sgemm
// (docs/numerics.md, "Error bounds": the fast-mode dot bound). With `rounds`, the product of
// round_to_bf16 of the operands it names; only where matmul_fast_rounds_as_packed(operands). The
// packing's VCVTNE2PS2BF16 also flushes fp32 subnormals to zero; VDPBF16PS flushes bf16 subnormals
// anyway, so the result has the rounded copy's bits except where an operand holds an fp32
// subnormal that rounds up to the smallest normal bf16 (within the flush term of the fast-mode
// bound) or a NaN with a payload.
void matmul_fast(int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t sam, int64_t sak,  // (M, K)
                 const float* B, int64_t sbk, int64_t sbn,  // (K, N)
                 float beta, float* C, int64_t ldc,         // (M, N)
                 Operands operands = Operands::kFp32, MatmulEpilogue epilogue = {}, RoundAsPacked rounds = {});
// Whether matmul_fast takes `rounds` for these operands: where they run the VDPBF16PS build, whose
// packing converts every element anyway.
bool matmul_fast_rounds_as_packed(Operands operands);

// Frees the packing scratch the products have kept on the calling thread, in every build this CPU
// runs; the next product allocates what it needs again. For a process whose start-up measured
// the GEMMs on products larger than its own.
void release_packing_scratch();

}  // namespace lockstep::cpu
