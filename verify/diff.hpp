// Comparing two tensor dumps (dump.hpp) tensor by tensor: `lockstep diff A B`.
//
// Tensors present in both dumps are compared in A's manifest order (execution order), each
// elementwise: exact mode counts an element as mismatching when its bits differ (two NaNs agree,
// verify/core/compare.hpp's policy); ulp:N when the two values are more than N ulps apart. Tensors of
// different shapes mismatch entirely. The first tensor with a mismatch is the first divergent one.
// Tensors present in one dump only are listed and do not count as a disagreement.
// With bounds (--bounds), an element mismatches when either side's value lies outside its op-local
// bound (verify/op_bounds.hpp: the exact op on that side's own dumped inputs, and what any fp32
// kernel may produce from them); each row also gives the tightness of A, of B, and of |A − B|
// against bound_A + bound_B + |y*_A − y*_B| (the input difference propagated exactly through the
// op). Tensors the reference does not produce (none today) are compared bitwise.
// Not here: bisect, plots.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "verify/core/dump.hpp"

namespace lockstep::verify {

struct DiffMode {
  uint64_t max_ulp = 0;  // 0 = exact (bitwise)
  // "exact" or "ulp:N" (N >= 0); ConfigError naming `what` otherwise.
  static DiffMode parse(const std::string& text, const std::string& what);
  std::string name() const;
};

struct TensorDiff {
  std::string name;
  int64_t step = 0;
  std::vector<int64_t> shape_a, shape_b;
  bool bitwise_equal = false;
  int64_t count = 0;       // elements compared
  int64_t mismatches = 0;  // elements outside the mode's tolerance (all of them if shapes differ)
  double max_abs_err = 0;
  double max_rel_err = 0;  // |a - b| / max(|a|, |b|) over elements that differ
  uint64_t max_ulp = 0;    // UINT64_MAX when a NaN meets a number
  int64_t first_index = -1;  // flat index of the first mismatch (C order); -1 if none
  float first_a = 0, first_b = 0;
  // --bounds only (bounded = true): elements outside their op-local bound on each side, the largest
  // err/bound of each side and of |A − B| against the combined bound, the largest combined bound.
  bool bounded = false;
  int64_t outside_a = 0, outside_b = 0;
  double tight_a = 0, tight_b = 0, tight_diff = 0, max_bound = 0;

  bool ok() const { return mismatches == 0; }
  double fraction() const { return count > 0 ? static_cast<double>(mismatches) / static_cast<double>(count) : 0.0; }
};

// Checkpoints the dumped steps started from, one root per side (`step_<N>` under it): --bounds.
struct BoundsInputs {
  std::string ckpt_a, ckpt_b;
};

struct DiffReport {
  std::string dir_a, dir_b;
  DiffMode mode;
  bool bounds = false;
  std::vector<TensorDiff> tensors;          // A's order
  std::vector<std::string> only_a, only_b;  // names present in one dump only
  std::optional<size_t> first_divergent;    // index into tensors

  bool agree() const { return !tensors.empty() && !first_divergent; }
  nlohmann::json to_json() const;
  void print(std::ostream& os) const;  // the first divergence, then one row per tensor
};

// Compares two equal-length arrays under `mode` (the TensorDiff's name, step and shapes unset).
TensorDiff diff_arrays(const float* a, const float* b, int64_t n, DiffMode mode);

// Reads both dumps and compares every common tensor; DataError naming the file on bad input.
// With `bounds`, each dumped step is checked against op-local bounds (slow: one Bounded<double>
// reference step per side and dumped step).
DiffReport diff_dumps(const std::string& dir_a, const std::string& dir_b, DiffMode mode,
                      const BoundsInputs* bounds = nullptr);

}  // namespace lockstep::verify
