// Kernel execution mode and the destination of parameter gradients.
#pragma once

#include <cstdint>
#include <string_view>

#include "src/core/exact_sum.hpp"

namespace lockstep {

enum class Mode : uint8_t {
  kCanonical,  // fixed order (canonical.hpp), own transcendentals: bitwise reproducible anywhere
  kFast,       // OpenBLAS sgemm, libm, fastest order: reproducible only within bounds
};

inline std::string_view mode_name(Mode m) { return m == Mode::kCanonical ? "canonical" : "fast"; }

// What the operands of a product hold. kBf16: every element is a bf16 value (round_to_bf16's
// result, kernels/ops/cast.hpp) in its fp32 container; the results are those of the fp32 contract
// on these values — the same bits in canonical mode — but the kernels may run bf16 instructions on
// them (fast mode: within the bound of docs/numerics.md, "Mixed precision").
enum class Operands : uint8_t { kFp32, kBf16 };

// Where a parameter gradient accumulates (+=). Exactly one of the two is set:
//  - fast mode: `f32` points at the tensor's fp32 gradient;
//  - canonical mode: `exact` is the model's flat exact accumulator and `offset` the tensor's first
//    element in it; kernels add each chunk partial with exact->add(offset + i, partial).
struct GradSink {
  float* f32 = nullptr;
  ExactAccumulator* exact = nullptr;
  int64_t offset = 0;

  bool empty() const { return f32 == nullptr && exact == nullptr; }
};

}  // namespace lockstep
