// The process-wide CPU settings of a run's [train] section — OpenMP and OpenBLAS threads, the
// kernels' ISA, fast mode's GEMM — applied once before its first step (train, bench, verify step).
#pragma once

#include <cstdint>

#include "src/train/config.hpp"

namespace lockstep {

// Applies [train] threads (0: every core), isa and fast_gemm; returns the thread count.
int64_t apply_cpu_settings(const TrainConfig& tc);

}  // namespace lockstep
