// The FP8 recipes ([train] precision = "fp8" with an [fp8] section), named as TransformerEngine
// and torchao name them. An FP8 linear is a bf16 linear (precision.hpp: bf16 activations and
// weight copy, bf16 outputs, fp32 accumulation) whose GEMMs — fprop, dgrad, wgrad, each or not —
// read their operands quantized to fp8 (kernels/ops/quantize.hpp) from those bf16 values:
//
//   delayed    one scale per tensor from the amax history of the steps before: TE's
//              DelayedScaling (history length, algorithm max or most_recent, margin); the step's
//              amax of every tensor, the maximum over its micro-batches and every rank, joins the
//              history after the step (fp8_state.hpp), so no tensor is read twice.
//   current    one scale per tensor from its own amax (the whole tensor's: the maximum over the
//              tensor-parallel ranks that hold parts of it), TE's Float8CurrentScaling.
//   mxfp8      OCP MX: blocks of 32 consecutive elements along each GEMM's reduced dimension with a
//              power-of-two (E8M0) scale each; the rowwise and columnwise copies that different
//              GEMMs read are both quantized from the bf16 tensor, never one from the other.
//   blockwise  DeepSeek-V3: 1 × 128 tiles of activations and gradients along the reduced
//              dimension, 128 × 128 blocks of weights, fp32 scales (or powers of two).
//
// Accumulation: fp32, or "hopper": the fp8 GEMMs accumulate as Hopper tensor cores do (limited
// accumulator promoted to fp32 every 128 elements of K, kernels/ops/fp8_accumulation.hpp).
//
// Formats: hybrid (E4M3 activations and weights, E5M2 gradients) or e4m3 everywhere. Scales of
// delayed and current scaling are fp32 unless power_of_two_scales. Linears listed in
// bf16_linears (default: the head, as Megatron-LM keeps its output layer) stay bf16; fp32_linears
// (precision.hpp) stay fp32.
//
// What each GEMM reads (K: its reduced dimension; blocks follow K):
//   fprop  out  = x · wᵀ      K = input features: x rowwise, w rowwise
//   dgrad  dx   = dy · w      K = output features: dy rowwise, w columnwise
//   wgrad  dw   = dyᵀ · x     K = tokens: dy columnwise, x columnwise
// The bias gradient comes from the bf16 output gradient, as TE's fused cast does.
// Not here: the quantization (kernels/ops/quantize.hpp), the scales' state (fp8_state.hpp), the
// linear that applies the recipe (fp8_linear.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/fp8_accumulation.hpp"
#include "kernels/ops/quantize.hpp"

namespace lockstep {

enum class Fp8Scaling : uint8_t { kDelayed, kCurrent, kMxfp8, kBlockwise };
// The three tensors of an FP8 linear.
enum class Fp8Role : uint8_t { kInput, kWeight, kGradOutput };
inline constexpr Fp8Role kFp8Roles[] = {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGradOutput};
// The copies the GEMMs read: blocks along a row (rowwise) or down a column (columnwise).
enum class Fp8Direction : uint8_t { kRowwise, kColumnwise };

const char* fp8_scaling_name(Fp8Scaling s);  // "delayed" | "current" | "mxfp8" | "blockwise"
const char* fp8_role_name(Fp8Role r);        // "input" | "weight" | "grad_output"

struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::kDelayed;
  bool hybrid = true;             // E5M2 gradients; false: E4M3 everywhere
  int64_t amax_history_len = 1024;
  bool amax_max = true;           // the history's maximum; false: its most recent entry
  int64_t margin = 0;             // scale = fp8_max / amax / 2^margin
  bool power_of_two = false;      // delayed, current, blockwise (mxfp8's scales always are)
  bool fprop = true, dgrad = true, wgrad = true;
  Accumulation accumulation = Accumulation::kFp32;
  std::vector<std::string> bf16_linears = {"head"};

  Fp8Format format(Fp8Role r) const { return hybrid && r == Fp8Role::kGradOutput ? Fp8Format::kE5M2 : Fp8Format::kE4M3; }
  bool per_tensor() const { return scaling == Fp8Scaling::kDelayed || scaling == Fp8Scaling::kCurrent; }
  // The block length along K (32 or 128; 0 for per-tensor recipes).
  int64_t block() const;
  // How tensor `role` (rows × cols, K along the rows for rowwise, down the columns for
  // columnwise) is quantized; `scale`: a per-tensor recipe's.
  QuantizeShape shape(Fp8Role role, Fp8Direction d, int64_t rows, int64_t cols, float scale) const;
  // One line for the start-up banner.
  std::string describe() const;
};

}  // namespace lockstep
