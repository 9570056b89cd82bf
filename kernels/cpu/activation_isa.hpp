// Internal: GELU's constants and the per-ISA vector loops of activation.isa.cpp, declared once for
// each namespace the file is compiled into (avx2, avx512). Only kernels/cpu/activation*.cpp
// include this; callers use kernels/ops/activation.hpp, whose gelu_forward/backward dispatch on
// active_isa() and finish the last n % width elements with the scalar code.
#pragma once

#include <cstdint>

namespace lockstep::cpu::gelu_constants {
inline constexpr float kK0 = 0.7978845608028654f;  // sqrt(2/π) rounded to fp32
inline constexpr float kK1 = 0.044715f;
inline constexpr float kK1x3 = 3.0f * kK1;         // d(k1·x³)/dx = 3·k1·x², 3·k1 rounded once
}  // namespace lockstep::cpu::gelu_constants

// gelu_*_vectors run the first n / width · width elements (width 8 for avx2, 16 for avx512), the
// scalar code's operations lane by lane, with OpenMP threads over blocks of vectors, and return
// how many elements they wrote.
#define LS_DECLARE_ACTIVATION_ISA(ns)                                                             \
  namespace lockstep::cpu::ns {                                                                   \
  int64_t gelu_forward_vectors(int64_t n, float* out, const float* inp);                          \
  int64_t gelu_backward_vectors(int64_t n, float* dinp, const float* inp, const float* dout);     \
  }

LS_DECLARE_ACTIVATION_ISA(avx2)
LS_DECLARE_ACTIVATION_ISA(avx512)

#undef LS_DECLARE_ACTIVATION_ISA
