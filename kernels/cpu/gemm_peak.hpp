// The fp32 GEMM peak of this CPU with the current threads (CpuBackend::measure_gemm_peak).
#pragma once

#include <algorithm>
#include <string>

#include "kernels/ops/mode.hpp"

namespace lockstep {

// The side of the square product the peak is measured on.
inline constexpr int kGemmPeakSize = 1024;

// The fp32 GEMM peak MFU is reported against: the best of the GEMMs this process can run, each
// timed on a square 1024 problem with the current thread count (measured, since nominal peaks are
// not what a CPU sustains). Every candidate is timed because any may be the fastest: OpenBLAS
// runs the kernel its environment selects (OPENBLAS_CORETYPE may hold it to AVX2, a DYNAMIC_ARCH
// build that does not know the CPU falls back to an old core), while Lockstep's GEMMs always use
// the widest ISA the CPU has; an MFU against a slower one could exceed 1.
struct GemmPeak {
  double gflops = 0;            // the highest of the three
  double openblas_gflops = 0;   // cblas_sgemm
  double canonical_gflops = 0;  // Lockstep's canonical GEMM (kernels/cpu/matmul.isa.cpp)
  double fast_gflops = 0;       // Lockstep's fast-mode GEMM (matmul_fast, the same kernel)
  std::string source;           // which one, with its kernel: "OpenBLAS sgemm (SkylakeX)"
  // Fast mode's product of bf16 operands on VDPBF16PS (matmul.hpp's Bf16Kernel::kDot); 0 where the
  // CPU lacks AVX512-BF16.
  double bf16_dot_gflops = 0;

  // Fast mode's fp32 GEMM: the faster of OpenBLAS's and Lockstep's.
  double fast_fp32_gflops() const { return std::max(openblas_gflops, fast_gflops); }
  // The peak of a run whose linears take these operands (for bf16: VDPBF16PS's where it is the
  // faster), and which GEMM it is.
  double gflops_for(Operands operands) const {
    return operands == Operands::kBf16 ? std::max(gflops, bf16_dot_gflops) : gflops;
  }
  std::string source_for(Operands operands) const {
    return operands == Operands::kBf16 && bf16_dot_gflops > gflops ? "VDPBF16PS (avx512bf16)" : source;
  }
  // "the fastest of OpenBLAS sgemm (Haswell) 104.6, Lockstep canonical GEMM (avx512) 141.9 and
  // Lockstep fast GEMM (avx512) 160.2 GFLOP/s, 1024^3": what a report prints beside the peak.
  std::string describe() const;
};
// `peak` with gflops and source set to its fastest candidate's (the first of equals): for
// candidates' figures set by hand or read back from a cache.
GemmPeak with_fastest(GemmPeak peak);
// Each candidate's higher figure of two measurements (a busy moment on a shared machine lowers
// one), and the fastest of those.
GemmPeak higher_peak(const GemmPeak& a, const GemmPeak& b);

// What choose_gemms made of a measurement, for the start-up line: "fast mode's GEMM Lockstep fast
// GEMM (avx512) (measured: 221.5 against OpenBLAS sgemm (Haswell) 116.0 GFLOP/s); bf16 products
// VDPBF16PS (avx512bf16) (measured: 740.2 against 221.5 GFLOP/s)".
std::string describe_choice(const GemmPeak& peak);

}  // namespace lockstep

namespace lockstep::cpu {

GemmPeak measure_gemm_peak();

// Where fast mode's GEMM and the bf16 products' kernel are left to kAuto (sgemm_threads.hpp,
// matmul.hpp), sets each to the faster of its candidates as `peak` measured them here, rather than
// by a rule about CPU names; a choice set by hand stays. Outside parallel regions.
void choose_gemms(const GemmPeak& peak);

}  // namespace lockstep::cpu
