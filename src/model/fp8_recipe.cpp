#include "src/model/fp8_recipe.hpp"

#include "src/core/check.hpp"

namespace lockstep {

const char* fp8_scaling_name(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::kDelayed: return "delayed";
    case Fp8Scaling::kCurrent: return "current";
    case Fp8Scaling::kMxfp8: return "mxfp8";
    case Fp8Scaling::kBlockwise: return "blockwise";
  }
  return "?";
}

const char* fp8_role_name(Fp8Role r) {
  switch (r) {
    case Fp8Role::kInput: return "input";
    case Fp8Role::kWeight: return "weight";
    case Fp8Role::kGradOutput: return "grad_output";
  }
  return "?";
}

int64_t Fp8Recipe::block() const {
  if (scaling == Fp8Scaling::kMxfp8) return 32;
  if (scaling == Fp8Scaling::kBlockwise) return 128;
  return 0;
}

QuantizeShape Fp8Recipe::shape(Fp8Role role, Fp8Direction d, int64_t rows, int64_t cols, float scale) const {
  QuantizeShape s{.rows = rows, .cols = cols, .format = format(role)};
  if (per_tensor()) {
    s.scaling = Fp8Scale::kPerTensor;
    s.scale = scale;
    return s;
  }
  s.scaling = scaling == Fp8Scaling::kMxfp8 || power_of_two ? Fp8Scale::kPowerOfTwo : Fp8Scale::kFp32;
  const int64_t b = block();
  if (scaling == Fp8Scaling::kBlockwise && role == Fp8Role::kWeight) {
    s.block_rows = s.block_cols = b;  // the same blocks serve both directions
  } else if (d == Fp8Direction::kRowwise) {
    s.block_cols = b;
  } else {
    s.block_rows = b;
  }
  return s;
}

std::string Fp8Recipe::describe() const {
  std::string s = str_cat("fp8 ", fp8_scaling_name(scaling), " scaling, ",
                          hybrid ? "hybrid (e4m3 activations and weights, e5m2 gradients)" : "e4m3 everywhere");
  if (scaling == Fp8Scaling::kDelayed) {
    s += str_cat(", amax history ", amax_history_len, " (", amax_max ? "max" : "most_recent", "), margin ", margin);
  } else if (scaling == Fp8Scaling::kCurrent) {
    s += str_cat(", margin ", margin);
  }
  if (scaling == Fp8Scaling::kMxfp8) {
    s += ", 32-element blocks with e8m0 scales";
  } else if (scaling == Fp8Scaling::kBlockwise) {
    s += str_cat(", 1x128 activation and gradient tiles, 128x128 weight blocks, ",
                 power_of_two ? "power-of-two" : "fp32", " scales");
  } else {
    s += power_of_two ? ", power-of-two scales" : ", fp32 scales";
  }
  std::string gemms;
  for (auto [on, name] : {std::pair{fprop, "fprop"}, std::pair{dgrad, "dgrad"}, std::pair{wgrad, "wgrad"}}) {
    if (on) gemms += str_cat(gemms.empty() ? "" : ",", name);
  }
  s += "; fp8 GEMMs: " + (gemms.empty() ? "none" : gemms);
  if (accumulation == Accumulation::kHopperFp8) {
    s += str_cat(", accumulated as on Hopper (e8m13, promoted to fp32 every ", kFp8PromotionInterval, ")");
  }
  return s;
}

}  // namespace lockstep
