#include "src/model/precision.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace lockstep {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
  }
  return "?";
}

Precision precision_from_name(const std::string& name) {
  if (name == "fp32") return Precision::kF32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp8") return Precision::kFp8;
  throw ConfigError(str_cat("[train] precision: expected \"fp32\", \"bf16\" or \"fp8\", got \"", name, "\""));
}

std::vector<std::string> linear_names(const ModelDesc& desc) {
  std::vector<std::string> out;
  for (const LayerDesc& l : desc.layers) {
    if (l.kind == LayerKind::kHead) {
      out.emplace_back(kHeadLinear);
      continue;
    }
    for (const ParamDecl& p : l.params) {
      if (p.matmul && !p.fp32_only && p.name.ends_with("/weight")) out.push_back(p.name.substr(0, p.name.size() - 7));
    }
  }
  return out;
}

std::string PrecisionRecipe::unmatched(std::span<const std::string> entries, const ModelDesc& desc) {
  const std::vector<std::string> linears = linear_names(desc);
  for (const std::string& e : entries) {
    if (std::none_of(linears.begin(), linears.end(), [&](const std::string& l) { return names(e, l); })) return e;
  }
  return {};
}

bool PrecisionRecipe::names(std::string_view entry, std::string_view name) {
  if (entry.empty() || !name.starts_with(entry)) return false;
  return name.size() == entry.size() || entry.back() == '/' || name[entry.size()] == '/';
}

Precision PrecisionRecipe::of_linear(std::string_view name) const {
  if (linears == Precision::kF32) return Precision::kF32;
  for (const std::string& e : fp32_linears) {
    if (names(e, name)) return Precision::kF32;
  }
  if (linears == Precision::kFp8) {
    for (const std::string& e : fp8.bf16_linears) {
      if (names(e, name)) return Precision::kBf16;
    }
  }
  return linears;
}

std::string PrecisionRecipe::fp8_layout_problem(const ModelDesc& desc, int64_t tp, bool sp, int64_t micro_tokens,
                                                int64_t step_micro_batches, bool canonical) const {
  if (linears != Precision::kFp8) return {};
  const int64_t b = fp8.block();
  const bool intervals = canonical && fp8.accumulation == Accumulation::kHopperFp8;
  const std::string recipe = fp8_scaling_name(fp8.scaling);
  // wgrad's columnwise copies cut the tokens into blocks; a row-parallel linear's output gradient
  // holds only this rank's tokens under sequence parallelism.
  if (b > 0 && tp > 1 && sp && (micro_tokens / tp) % b != 0) {
    return str_cat("fp8 recipe ", recipe, " quantizes blocks of ", b, " tokens, but sequence parallelism gives each of ",
                   tp, " ranks ", micro_tokens / tp, " tokens of a micro-batch (", micro_tokens,
                   "); choose micro_batch_size x seq_len a multiple of ", b * tp);
  }
  // wgrad sums the step's tokens; each micro-batch's must start a promotion interval.
  if (intervals && step_micro_batches > 1 && micro_tokens % kFp8PromotionInterval != 0) {
    return str_cat("[fp8] accumulate = \"hopper\" promotes every ", kFp8PromotionInterval,
                   " tokens of a weight gradient, but the step's ", step_micro_batches, " micro-batches hold ",
                   micro_tokens, " tokens each; in canonical mode choose micro_batch_size x seq_len a multiple of ",
                   kFp8PromotionInterval);
  }
  if (tp == 1 || (b == 0 && !intervals)) return {};
  // Both a block and a promotion interval must not be cut: the larger of the two (both powers of two).
  const int64_t unit = std::max(b, intervals ? kFp8PromotionInterval : int64_t{0});
  const std::string what = b == unit ? str_cat("fp8 recipe ", recipe, " quantizes blocks of ", b)
                                     : str_cat("[fp8] accumulate = \"hopper\" promotes every ", unit, " elements");
  for (const LayerDesc& l : desc.layers) {
    for (const ParamDecl& p : l.params) {
      if (!p.matmul || p.split_dim < 0 || !p.name.ends_with("/weight")) continue;
      const std::string linear = l.kind == LayerKind::kHead ? kHeadLinear : p.name.substr(0, p.name.size() - 7);
      if (!fp8_linear(linear)) continue;
      for (int64_t seg : p.segments) {
        if ((seg / tp) % unit == 0) continue;
        return str_cat(what, " along ", linear, "'s ", p.split_dim == 0 ? "output" : "input",
                       " features, but tensor parallelism over ", tp, " ranks gives each rank ", seg / tp,
                       " of a segment of ", seg, "; keep it in bf16 ([fp8] bf16_linears) or choose dims whose share is a multiple of ",
                       unit);
      }
    }
  }
  return {};
}

std::string PrecisionRecipe::describe() const {
  if (linears == Precision::kF32) return "fp32";
  // "; LABEL: a b c", or nothing for an empty list.
  const auto listed = [](const char* label, const std::vector<std::string>& entries) {
    std::string out = entries.empty() ? "" : str_cat("; ", label, ":");
    for (const std::string& e : entries) out += " " + e;
    return out;
  };
  if (linears == Precision::kFp8) {
    return fp8.describe() + "; otherwise as bf16 with fp32 master weights" + listed("bf16 linears", fp8.bf16_linears) +
           listed("fp32 linears", fp32_linears);
  }
  return str_cat(
      "bf16 (linear layers: bf16 inputs, weights and outputs, fp32 accumulation; ",
      master_weights ? "fp32 master weights, AdamW state and gradients"
                     : "bf16 parameters updated by stochastic rounding (no master weights), fp32 AdamW state and "
                       "gradients",
      "; norms, attention scores and softmax, loss, residual stream in fp32)", listed("fp32 linears", fp32_linears));
}

}  // namespace lockstep
