// The precision recipe of a model ([train] precision and fp32_linears, and [fp8]): which linear
// layers run in bf16 or fp8, and what that means for the tensors around them.
//
//   fp32   every op in fp32 (the default).
//   bf16   each linear layer in bf16 unless fp32_linears names it: its inputs — the activation it
//          reads (stored in bf16 by the op that produces it: a norm, the activation, attention's
//          output; q, k, v after RoPE), the weights (a bf16 copy of the fp32 master weights,
//          made from them before each forward) and, in the backward, the output gradient — are
//          bf16, the GEMM accumulates in fp32 in its own contract's order (a bf16 × bf16 product
//          is exact in fp32), and its outputs — the product and the input gradient — are stored
//          in bf16. The weight gradient accumulates in fp32 (canonical mode: exactly), unrounded,
//          as Megatron's fp32 main gradients do; gradients are reduced, clipped and applied by
//          AdamW to the fp32 master weights and moments as in fp32. Norms, softmax, attention's
//          scores, the loss and its statistics, the residual stream and its gradient stay fp32.
//   fp8    each linear as in bf16, its GEMMs reading fp8-quantized operands (fp8_recipe.hpp),
//          unless the [fp8] section's bf16_linears keeps it bf16 or fp32_linears fp32.
//
// Every bf16 value is held in an fp32 container (kernels/ops/cast.hpp's rounding): the numbers
// are the recipe's, the memory and speed are not yet a bf16 store's. Canonical mode stays bitwise
// across threads, ISAs and layouts: the roundings are elementwise, applied to values that are
// already layout-independent.
//
// Linear layers are named by their weight without "/weight" — layer/N/attn/qkv, layer/N/attn/proj,
// layer/N/mlp/fc, layer/N/mlp/proj — and `head` (tied or not); an fp32_linears entry names one of
// them or every one under a prefix that ends at a '/' ("layer/0" keeps block 0 in fp32).
// Not here: the roundings' bounds (reference/cast.hpp), the layers that apply them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/fp8_recipe.hpp"
#include "src/model/layer_list.hpp"

namespace lockstep {

enum class Precision : uint8_t { kF32, kBf16, kFp8 };

// The head's linear, tied or not.
inline constexpr const char* kHeadLinear = "head";

std::string_view precision_name(Precision p);  // "fp32" | "bf16" | "fp8"
// Throws ConfigError naming the expected values.
Precision precision_from_name(const std::string& name);

// The model's linear layers whose precision the recipe sets (all but ParamDecl::fp32_only ones), by
// the names above, in layer order.
std::vector<std::string> linear_names(const ModelDesc& desc);

struct PrecisionRecipe {
  Precision linears = Precision::kF32;
  std::vector<std::string> fp32_linears;  // names or prefixes, as above
  // bf16 only. false: every parameter is a bf16 value (rounded to nearest at initialisation) and
  // AdamW's fp32 result is rounded to bf16 stochastically, each element with the Philox word of
  // (seed, tensor, step, global index) — kernels/ops/cast.hpp — so layouts do not change the bits;
  // the moments and gradients stay fp32. true: fp32 master weights, bf16 copies for the linears.
  bool master_weights = true;
  Fp8Recipe fp8;  // fp8 only

  bool bf16_params() const { return linears == Precision::kBf16 && !master_weights; }

  // The precision linear `name` runs in; whether its operands and outputs are stored in bf16 (a
  // bf16 or fp8 linear); whether its GEMMs read fp8.
  Precision of_linear(std::string_view name) const;
  bool low_precision(std::string_view name) const { return of_linear(name) != Precision::kF32; }
  bool fp8_linear(std::string_view name) const { return of_linear(name) == Precision::kFp8; }
  // The tokens of one chunk of linear `name`'s canonical weight gradient: a promotion interval
  // where its wgrad runs the Hopper accumulator, else the canonical chunk.
  int64_t weight_grad_chunk(std::string_view name) const {
    const bool hopper = fp8_linear(name) && fp8.wgrad && fp8.accumulation == Accumulation::kHopperFp8;
    return hopper ? kFp8PromotionInterval : kCanonicalChunk;
  }
  // An entry of a list of linears (fp32_linears, fp8.bf16_linears) that names no linear of `desc`
  // ("": none).
  static std::string unmatched(std::span<const std::string> entries, const ModelDesc& desc);
  // "" or what keeps an fp8 recipe from giving a layout (tp ranks, sequence parallel or not,
  // micro-batches of micro_tokens, step_micro_batches of them over all dp ranks) the one-process
  // bits: a split of an fp8 linear's weight, or of a micro-batch's tokens, that does not fall on a
  // block boundary; in canonical mode under Hopper accumulation, a split of a reduced dimension
  // (the weight's under tp, the step's tokens between micro-batches) off a promotion interval.
  std::string fp8_layout_problem(const ModelDesc& desc, int64_t tp, bool sp, int64_t micro_tokens,
                                 int64_t step_micro_batches, bool canonical) const;
  // Whether fp32_linears entry `entry` names linear `name`.
  static bool names(std::string_view entry, std::string_view name);
  // One line for the start-up banner, e.g. "bf16 (fp32 master weights ...); fp32 linears: head".
  std::string describe() const;
};


}  // namespace lockstep
