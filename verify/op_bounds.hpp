// Op-local bounds for the tensors of one dumped step (`lockstep diff --bounds`, `bisect --bounds`).
//
// For each dumped tensor X of a side, the whole-step reference (reference/gpt.hpp) runs in
// Bounded<double> re-anchored on that side's dumped tensors at every hook point, from the side's
// checkpoint before the step (parameters, AdamW moments, the batch from its sampler state). So the
// reference value y*(X) is the exact result of the ops since the previous dumped tensor applied to
// the side's own dumped inputs, and bound(X) bounds what any fp32 kernel running those ops may
// produce, whatever its summation order (docs/numerics.md, "Bounded<T>"). A side's tensor
// is within bounds when |X − y*| <= bound elementwise.
//
// What this covers, and what it does not:
//  - it is op-local: each bound covers the ops between two dumped tensors on one side's inputs; it
//    says whether a side computed *its own* op correctly, not whether two sides' inputs are close;
//  - for two sides, |X_A − X_B| <= bound_A + bound_B + |y*_A − y*_B| follows by the triangle
//    inequality, where |y*_A − y*_B| is the input difference propagated exactly through the op;
//    diff reports that combined bound and the observed difference's tightness against it;
//  - values are computed in double, not MPFR: the reference's own double roundings are counted
//    into the bound by running it with u = 2^-24 + 2^-51 (reference::kBoundedDoubleU); what is
//    left uncovered is the rounding of the bound's own arithmetic, about 1e-15 of each bound;
//  - the running error analysis assumes no overflow: a kernel whose fp32 result overflows where
//    the exact value is finite (a huge planted value squared in a norm) is reported outside;
//  - tensors that are not dumped are not anchored: the reference carries its own bound through
//    them (still a bound, looser). AdamW moments are not dumped and not checked.
// Not here: the comparison table (diff.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/train/config.hpp"
#include "verify/core/dump.hpp"

namespace lockstep::verify {

struct OpLocalBound {
  std::vector<double> value;  // y*: the exact op on the side's dumped inputs (double)
  std::vector<double> bound;  // |kernel result − y*| <= bound for any valid fp32 kernel
};

// The run's configuration as the dump's manifest records it (RunConfig::to_json): every key as an
// override of an empty file, so that it is validated exactly as the trainer validated it.
RunConfig dump_run_config(const Dump& dump);

// For every tensor of `step` in `dump` (keys are hook names without `step/N/`), its reference value
// and bound. `ckpt_root` holds the checkpoint written before the step (`step_<N>` under it, or
// `ckpt_root` is that checkpoint); step 0 without one starts from the config's initial state. ConfigError / DataError naming the file on a missing checkpoint,
// a model that does not match the dump's config, or an unreadable data file.
std::map<std::string, OpLocalBound> op_local_bounds(const Dump& dump, int64_t step, const std::string& ckpt_root);

}  // namespace lockstep::verify
