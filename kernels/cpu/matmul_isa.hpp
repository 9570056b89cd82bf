// Internal: the per-ISA entry points of matmul.isa.cpp, declared once for each namespace the file
// is compiled into (avx2, avx512, avx512bf16). In avx512bf16 (AVX-512 with AVX512-BF16) the same
// contracts hold for operands whose elements are bf16 values in fp32 containers: they are packed as
// bf16 pair words and multiplied with VDPBF16PS where that gives the FMA chain's bits (matmul.isa.cpp),
// and an element that is not a bf16 value is an error. Only kernels/cpu/matmul.cpp includes this; everyone else goes
// through kernels/cpu/matmul.hpp, which dispatches on active_isa().
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.hpp"

// All take unpacked operands with arbitrary strides and pack them themselves; see matmul.hpp for
// the contracts of the like-named dispatchers.
//  matmul_canonical_packed: chunks of 64 over K, exact combination, one rounding, epilogue.
//  matmul_chunk_partials_packed: K <= kCanonicalChunk, the raw fp32 chain per element.
//  matmul_chunks_exact_packed: chunks of 64 over K, every element's exact sum of chunk partials
//    added to acc[offset + m*N + n].
//  matmul_fast_packed: fast mode's C = alpha·A·B + beta·C, no canonical order (round_bf16: C
//    rounded to bf16 as stored; rounds, the avx512bf16 build only: A and/or B rounded to bf16 as packed).
//  release_packing_scratch: frees the calling thread's packing scratch of this build.
#define LS_DECLARE_MATMUL_ISA(ns)                                                             \
  namespace lockstep::cpu::ns {                                                               \
  void matmul_canonical_packed(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,        \
                               const float* A, int64_t sam, int64_t sak, const float* B,      \
                               int64_t sbk, int64_t sbn, MatmulEpilogue epilogue);            \
  void matmul_chunk_partials_packed(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,   \
                                    const float* A, int64_t sam, int64_t sak, const float* B, \
                                    int64_t sbk, int64_t sbn);                                \
  void matmul_chunks_exact_packed(int64_t M, int64_t N, int64_t K, ExactAccumulator& acc,     \
                                  int64_t offset, const float* A, int64_t sam, int64_t sak,   \
                                  const float* B, int64_t sbk, int64_t sbn);                  \
  void matmul_fast_packed(int64_t M, int64_t N, int64_t K, float alpha, const float* A,       \
                          int64_t sam, int64_t sak, const float* B, int64_t sbk, int64_t sbn, \
                          float beta, float* C, int64_t ldc, MatmulEpilogue epilogue,         \
                          RoundAsPacked rounds);                                              \
  void release_packing_scratch();                                                             \
  }

LS_DECLARE_MATMUL_ISA(avx2)
LS_DECLARE_MATMUL_ISA(avx512)
LS_DECLARE_MATMUL_ISA(avx512bf16)

#undef LS_DECLARE_MATMUL_ISA
