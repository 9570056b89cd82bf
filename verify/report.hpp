// The per-tensor report of `lockstep verify step`: one row per tensor in execution order with its
// check (bitwise, or within a Bounded<mpfr> bound), max error, max bound, tightness (error/bound),
// max ulp distance and verdict; a summary naming the worst tensor; the same as JSON.
// Not here: computing the rows (verify/step.cpp) or comparing (verify/core/compare.hpp).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "verify/core/compare.hpp"

namespace lockstep::verify {

enum class CheckKind : uint8_t {
  kBitwise,  // canonical mode vs the CanonicalF32 emulation
  kBound,    // |trainer − reference| <= Bounded<mpfr> bound
};

struct TensorRow {
  std::string name;             // hook name (`layer/1/attn/qkv`, `grad/logits`) or state name
  std::vector<int64_t> shape;
  CheckKind check = CheckKind::kBitwise;
  CompareReport cmp;
};

struct StepReport {
  std::string mode;              // "canonical" | "fast"
  std::string reference;         // "CanonicalF32" | "Bounded<mpfr 256 bits>"
  int64_t step = 0;              // 0-based step that was run (the checkpoint's step count)
  double trainer_seconds = 0;
  double reference_seconds = 0;
  float grad_norm = 0;           // the trainer's gradient norm before clipping
  float grad_clip = 0;           // [train] grad_clip (0: off)
  std::vector<TensorRow> rows;

  // Whether the step scaled its gradient (clip_scale's rule): which branch of clipping it checked.
  bool clipped() const;

  bool ok() const;
  // The row with the largest tightness (bound checks) or, in bitwise checks, the first failing row
  // or else the one with the largest ulp distance; nullptr without rows.
  const TensorRow* worst() const;
  double worst_tightness() const;  // over bound rows (0 without any)
};

// A table (one row per tensor) and a summary line: `verify step: PASS|FAIL ... worst tensor NAME`.
void print_report(const StepReport& r, std::ostream& out);
nlohmann::json report_json(const StepReport& r);

}  // namespace lockstep::verify
