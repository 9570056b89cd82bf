// The step's optimizer hyper-parameters computed by the reference from [train]'s numbers alone,
// not taken from src/optim: the learning rate of the warm-up + cosine schedule, AdamW's bias
// corrections and which parameter classes decay.
//
// Each value is exact in MPFR (128 bits), rounded once to fp32. The trainer computes the schedule
// and the corrections in double (src/optim/adamw.hpp: about 2^-50 relative) and rounds to fp32, so
// the two agree bit for bit unless the exact value lies within 2^-50 relative of a midpoint between
// two floats (a chance of about 2^-26 per value); verify step would then report that 1-ulp
// difference on its hyper/ rows rather than hide it.
// Not here: the update itself (reference/optim.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include <boost/multiprecision/mpfr.hpp>

#include "reference/real.hpp"
#include "src/model/layer_list.hpp"

namespace lockstep::reference {

struct ScheduleSpec {
  double lr = 0, min_lr = 0;
  int64_t warmup = 0;  // steps of linear warm-up
  int64_t steps = 1;   // total steps
};

// lr·(step+1)/warmup for 0-based step < warmup; then min_lr + (lr − min_lr)·(1 + cos(π·p))/2 with
// p = min(1, (step − warmup)/(steps − warmup − 1)); lr when fewer than two steps follow warm-up.
inline Mpfr schedule_lr_exact(const ScheduleSpec& s, int64_t step) {
  ScopedMpfrBits bits(128);
  if (s.warmup > 0 && step < s.warmup) return Mpfr(s.lr) * Mpfr(step + 1) / Mpfr(s.warmup);
  const int64_t decay_steps = s.steps - s.warmup;
  if (decay_steps <= 1) return Mpfr(s.lr);
  Mpfr p = Mpfr(step - s.warmup) / Mpfr(decay_steps - 1);
  if (p > 1) p = 1;
  const Mpfr pi = acos(Mpfr(-1));
  return Mpfr(s.min_lr) + (Mpfr(s.lr) - Mpfr(s.min_lr)) * (1 + cos(pi * p)) / 2;
}

// 1 − β^t for 1-based step t, β the fp32 value AdamW uses.
inline Mpfr bias_correction_exact(float beta, int64_t t) {
  ScopedMpfrBits bits(128);
  return 1 - pow(Mpfr(beta), Mpfr(t));
}

// The classes [train] weight_decay_on names: a comma-separated list of the layer list's class
// names, or "none" / "" for none (the trainer has validated the list).
inline std::array<bool, kNumParamClasses> decayed_classes(std::string_view list) {
  std::array<bool, kNumParamClasses> out{};
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    for (int c = 0; c < kNumParamClasses; ++c)
      if (name == param_class_name(static_cast<ParamClass>(c))) out[static_cast<size_t>(c)] = true;
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return out;
}

}  // namespace lockstep::reference
