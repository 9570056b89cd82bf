#include "kernels/cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "src/core/check.hpp"

namespace lockstep {

CpuBackend::CpuBackend(const CpuSettings& s) {
  LS_REQUIRE(s.isa == "auto" || s.isa == "avx2" || s.isa == "avx512", "isa: expected \"auto\", \"avx2\" or ",
             "\"avx512\", got \"", s.isa, "\"");
  LS_REQUIRE(s.fast_gemm == "auto" || s.fast_gemm == "openblas" || s.fast_gemm == "lockstep",
             "fast_gemm: expected \"auto\", \"openblas\" or \"lockstep\", got \"", s.fast_gemm, "\"");
  threads_ = s.threads > 0 ? s.threads : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(static_cast<int>(threads_));
  openblas_set_num_threads(static_cast<int>(threads_));
  if (s.isa != "auto") cpu::set_isa(s.isa == "avx2" ? cpu::Isa::kAvx2 : cpu::Isa::kAvx512);
  cpu::set_fast_gemm(s.fast_gemm == "openblas"   ? cpu::FastGemm::kOpenBlas
                     : s.fast_gemm == "lockstep" ? cpu::FastGemm::kLockstep
                                                 : cpu::FastGemm::kAuto);
}

CpuBackend CpuBackend::current() { return CpuBackend(static_cast<int64_t>(omp_get_max_threads())); }

std::string CpuBackend::isa_name() const { return std::string(cpu::isa_name(cpu::active_isa())); }
std::string CpuBackend::fast_gemm_name() const { return cpu::fast_gemm_name(); }
std::string CpuBackend::bf16_kernel_name() const { return cpu::bf16_kernel_name(); }
std::string CpuBackend::blas_core() const { return openblas_get_corename(); }

std::string CpuBackend::describe(Mode mode) const {
  return isa_name() + (mode == Mode::kFast ? " (fast mode's GEMM " + fast_gemm_name() + ")" : std::string());
}

bool CpuBackend::rounds_bf16_as_read(Mode mode) const {
  return cpu::linear_rounds_as_read(mode, Operands::kBf16, Accumulation::kFp32);
}

#define LS_OP(name, params, args) \
  void CpuBackend::name params { cpu::name args; }
#include "kernels/ops/ops.def"
#undef LS_OP

Backend& process_backend() {
  static CpuBackend backend = CpuBackend::current();
  return backend;
}

}  // namespace lockstep
