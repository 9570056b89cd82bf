#include "kernels/cpu/gemm_peak.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"

namespace lockstep {

namespace {

// Best GFLOP/s of three timed runs of a square n^3 product, after one untimed run (page faults,
// thread start, packing buffers).
template <class Run>
double best_gflops(int64_t n, Run run) {
  run();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s / 1e9);
  }
  return best;
}

std::string lockstep_name(const char* which) {
  return std::string("Lockstep ") + which + " GEMM (" + std::string(cpu::isa_name(cpu::active_isa())) + ")";
}

}  // namespace

GemmPeak with_fastest(GemmPeak peak) {
  const std::pair<double, std::string> candidates[] = {{peak.openblas_gflops, cpu::openblas_sgemm_name()},
                                                       {peak.canonical_gflops, lockstep_name("canonical")},
                                                       {peak.fast_gflops, lockstep_name("fast")}};
  peak.gflops = -1;
  for (const auto& [gflops, name] : candidates) {
    if (gflops > peak.gflops) {
      peak.gflops = gflops;
      peak.source = name;
    }
  }
  return peak;
}

GemmPeak cpu::measure_gemm_peak() {
  const int n = kGemmPeakSize;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  GemmPeak peak;
  peak.openblas_gflops = best_gflops(n, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  });
  peak.canonical_gflops = best_gflops(n, [&] {
    cpu::matmul_canonical(n, n, n, c.data(), n, a.data(), n, 1, b.data(), n, 1);
  });
  peak.fast_gflops = best_gflops(n, [&] {
    cpu::matmul_fast(n, n, n, 1.0f, a.data(), n, 1, b.data(), n, 1, 0.0f, c.data(), n);
  });
  if (cpu::active_isa() == cpu::Isa::kAvx512 && cpu::bf16_dot_supported()) {
    const cpu::Bf16Kernel before = cpu::bf16_kernel_setting();  // kAuto stays kAuto for choose_gemms
    cpu::set_bf16_kernel(cpu::Bf16Kernel::kDot);  // a and b hold bf16 values
    peak.bf16_dot_gflops = best_gflops(n, [&] {
      cpu::matmul_fast(n, n, n, 1.0f, a.data(), n, 1, b.data(), n, 1, 0.0f, c.data(), n, Operands::kBf16);
    });
    cpu::set_bf16_kernel(before);
  }
  // Products of 1024^3 keep packing scratch that most runs' products never need.
  cpu::release_packing_scratch();
  return with_fastest(peak);
}

void cpu::choose_gemms(const GemmPeak& peak) {
  if (fast_gemm_setting() == FastGemm::kAuto) {
    set_fast_gemm(peak.fast_gflops > peak.openblas_gflops ? FastGemm::kLockstep : FastGemm::kOpenBlas);
  }
  if (bf16_kernel_setting() == Bf16Kernel::kAuto) {
    set_bf16_kernel(peak.bf16_dot_gflops > peak.fast_fp32_gflops() ? Bf16Kernel::kDot : Bf16Kernel::kFma);
  }
}

std::string describe_choice(const GemmPeak& peak) {
  const bool lockstep = cpu::active_fast_gemm() == cpu::FastGemm::kLockstep;
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << "fast mode's GEMM " << cpu::fast_gemm_name() << " ("
    << (lockstep ? peak.fast_gflops : peak.openblas_gflops) << " GFLOP/s measured; "
    << (lockstep ? cpu::openblas_sgemm_name() : lockstep_name("fast")) << " "
    << (lockstep ? peak.openblas_gflops : peak.fast_gflops) << ")";
  if (peak.bf16_dot_gflops > 0) {
    const bool dot = cpu::active_bf16_kernel() == cpu::Bf16Kernel::kDot;
    const double fp32 = peak.fast_fp32_gflops();
    s << "; bf16 products " << cpu::bf16_kernel_name() << " (" << (dot ? peak.bf16_dot_gflops : fp32)
      << " GFLOP/s measured; " << (dot ? "fp32 FMA " : "VDPBF16PS ") << (dot ? fp32 : peak.bf16_dot_gflops) << ")";
  }
  return s.str();
}

GemmPeak higher_peak(const GemmPeak& a, const GemmPeak& b) {
  GemmPeak peak;
  peak.openblas_gflops = std::max(a.openblas_gflops, b.openblas_gflops);
  peak.canonical_gflops = std::max(a.canonical_gflops, b.canonical_gflops);
  peak.fast_gflops = std::max(a.fast_gflops, b.fast_gflops);
  peak.bf16_dot_gflops = std::max(a.bf16_dot_gflops, b.bf16_dot_gflops);
  return with_fastest(peak);
}

std::string GemmPeak::describe() const {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << "the fastest of " << cpu::openblas_sgemm_name() << " " << openblas_gflops
    << ", " << lockstep_name("canonical") << " " << canonical_gflops << " and " << lockstep_name("fast")
    << " " << fast_gflops << " GFLOP/s, " << kGemmPeakSize << "^3";
  if (bf16_dot_gflops > 0) s << "; on bf16 operands VDPBF16PS (avx512bf16) " << bf16_dot_gflops << " GFLOP/s";
  return s.str();
}

}  // namespace lockstep
