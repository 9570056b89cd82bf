// The residual add on the CPU (contract in kernels/ops/residual.hpp): independent elements over
// the OpenMP threads.
#include "kernels/ops/residual.hpp"

namespace lockstep::cpu {

void residual_forward(int64_t n, float* out, const float* a, const float* b) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace lockstep::cpu
