#include "src/train/cpu_setup.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/sgemm_threads.hpp"

namespace lockstep {

int64_t apply_cpu_settings(const TrainConfig& tc) {
  const int threads = tc.threads > 0 ? static_cast<int>(tc.threads)
                                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  if (tc.isa != "auto") cpu::set_isa(tc.isa == "avx2" ? cpu::Isa::kAvx2 : cpu::Isa::kAvx512);
  cpu::set_fast_gemm(tc.fast_gemm == "openblas"   ? cpu::FastGemm::kOpenBlas
                     : tc.fast_gemm == "lockstep" ? cpu::FastGemm::kLockstep
                                                  : cpu::FastGemm::kAuto);
  return threads;
}

}  // namespace lockstep
