// The CPU backend: the ops of kernels/ops/ops.def run by kernels/cpu, with the process-wide choices
// they depend on — OpenMP and OpenBLAS threads, the SIMD instruction set of the kernels (isa.hpp),
// and the GEMM of fast mode (sgemm_threads.hpp) — set in one place, by constructing it. The
// kernels read those choices as process state (a kernel call must not mix ISAs across threads), so
// a process runs one CpuBackend at a time; tests switch the ISA with ScopedIsa as before.
// Its GEMM peak (gemm_peak.hpp) is what MFU is reported against.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.hpp"
#include "kernels/cpu/gemm_peak.hpp"

namespace lockstep {

struct CpuSettings {
  int64_t threads = 0;            // 0: every core
  std::string isa = "auto";       // "auto" (the widest the CPU has) | "avx2" | "avx512"
  std::string fast_gemm = "auto"; // "auto" | "openblas" | "lockstep" (sgemm_threads.hpp's FastGemm)
};

class CpuBackend final : public Backend {
 public:
  // Applies the settings to the process. ConfigError for an ISA the CPU lacks or an unknown value.
  explicit CpuBackend(const CpuSettings& settings);
  // The process's settings as they are, changing nothing.
  static CpuBackend current();

  int64_t threads() const { return threads_; }
  std::string isa_name() const;
  std::string fast_gemm_name() const;  // "OpenBLAS sgemm (SkylakeX)", "Lockstep fast GEMM (avx512; ...)"
  std::string bf16_kernel_name() const;  // "VDPBF16PS (avx512bf16)", "fp32 FMA (avx2)" (matmul.hpp)
  std::string blas_core() const;       // the kernel OpenBLAS chose for this CPU, e.g. "Haswell"
  // The GEMM peak of this process with its threads, measured now.
  GemmPeak measure_gemm_peak() const { return cpu::measure_gemm_peak(); }
  // Fast mode's GEMM and the bf16 products' kernel, where left to auto: the faster as measured.
  void choose_gemms(const GemmPeak& peak) const { cpu::choose_gemms(peak); }

  std::string describe(Mode mode) const override;
  bool rounds_bf16_as_read(Mode mode) const override;

#define LS_OP(name, params, args) void name params override;
#include "kernels/ops/ops.def"
#undef LS_OP

 private:
  explicit CpuBackend(int64_t threads) : threads_(threads) {}
  int64_t threads_ = 1;
};

}  // namespace lockstep
