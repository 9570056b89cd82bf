#include "src/model/precision.hpp"

#include <algorithm>

#include "src/core/check.hpp"

namespace lockstep {

std::string_view precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

Precision precision_from_name(const std::string& name) {
  if (name == "fp32") return Precision::kF32;
  if (name == "bf16") return Precision::kBf16;
  throw ConfigError(str_cat("[train] precision: expected \"fp32\" or \"bf16\", got \"", name, "\""));
}

std::vector<std::string> linear_names(const ModelDesc& desc) {
  std::vector<std::string> out;
  for (const LayerDesc& l : desc.layers) {
    if (l.kind == LayerKind::kHead) {
      out.emplace_back(kHeadLinear);
      continue;
    }
    for (const ParamDecl& p : l.params) {
      if (p.matmul && p.name.ends_with("/weight")) out.push_back(p.name.substr(0, p.name.size() - 7));
    }
  }
  return out;
}

std::string PrecisionRecipe::unmatched(const ModelDesc& desc) const {
  const std::vector<std::string> linears = linear_names(desc);
  for (const std::string& e : fp32_linears) {
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
  return linears;
}

std::string PrecisionRecipe::describe() const {
  if (linears == Precision::kF32) return "fp32";
  std::string s = str_cat(
      "bf16 (linear layers: bf16 inputs, weights and outputs, fp32 accumulation; ",
      master_weights ? "fp32 master weights, AdamW state and gradients"
                     : "bf16 parameters updated by stochastic rounding (no master weights), fp32 AdamW state and "
                       "gradients",
      "; norms, attention scores and softmax, loss, residual stream in fp32)");
  if (!fp32_linears.empty()) {
    s += "; fp32 linears:";
    for (const std::string& e : fp32_linears) s += " " + e;
  }
  return s;
}

}  // namespace lockstep
