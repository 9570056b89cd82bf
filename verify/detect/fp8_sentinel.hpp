// The FP8 sentinel: is a layer's quantization costing more than its recipe should, before the loss
// shows it? Two judgements (docs/numerics.md, "FP8"):
//
//  - every step, the per-tensor statistics of the step (src/model/fp8_state.hpp, combined over
//    every rank): a finding when a tensor's quantization error passes what rounding alone may
//    cost (Fp8TensorStats::error_ratio above 1: ‖x̃ − x‖₂ against ‖e(x)‖₂, e below — only
//    saturation can do that, and only when the clipped part outweighs the whole tensor's rounding),
//    when its saturated fraction passes `saturation`, or its underflowed fraction (of its non-zero
//    elements) passes `underflow` where its scale came from data (not delayed scaling's first step,
//    which runs on scale 1 before any history);
//  - every `every` steps, a shadow recompute of each fp8 GEMM of the step's first micro-batch on
//    `rows` sampled output rows (all columns): in fp32, the product of the quantized operands
//    against the product of the bf16 ones they came from. Their difference is what quantization
//    did; the recipe predicts it per element from the operands: an element a of a block with
//    inverse scale inv is moved by at most e(a) = (u_fp8 + 3·u_fp32)·|a| + h_fp8·inv (h: half the
//    smallest fp8 subnormal) unless it saturated, so a product element moves by at most
//        W = Σ_k e(a_k)·|b̃_k| + |a_k|·e(b_k)                  (worst case)
//        P = λ · sqrt(Σ_k (e(a_k)·|b̃_k| + |a_k|·e(b_k))²)      (Hoeffding: with the roundings
//    independent and mean-zero, exceeded with probability below 2·exp(−λ²/2)). A finding when the
//    observed error passes P (λ = 8: 2.5e-14 an element). Saturated elements, a stale or wrong
//    scale, a recipe that does not fit the data show up here; so would a wrong quantization.
//
// A finding names the tensor or GEMM, its role and format, the recipe, and the history of the
// tensor's amax and scale over the last steps; a statistic is reported once it has stayed past its
// bound for `patience` steps in a row (a one-step jump of a tensor's range, which delayed scaling
// corrects at the next step, is not an instability), a GEMM check when it fails; neither again
// while the condition lasts. Each check also writes the ranking of the GEMMs by relative error (which
// layers' quantization hurts most) to the console and the metrics JSONL ("fp8_sentinel").
// Not here: the statistics themselves (src/train/fp8_statistics.hpp), the quantization
// (kernels/ops/quantize.hpp).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm/communicator.hpp"
#include "src/model/model.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

struct Fp8SentinelRule {
  int64_t every = 20;        // shadow checks every N-th step (0: statistics only)
  int64_t rows = 4;          // output rows a check samples per GEMM
  double lambda = 8;         // of the probabilistic bound
  double saturation = 1e-2;  // fraction of a tensor's elements
  double underflow = 0.5;    // fraction of a tensor's non-zero elements
  int64_t history = 8;       // steps of amax and scale a finding quotes
  int64_t patience = 3;      // steps a statistic stays past its bound before it is reported
};

// The shadow check of one GEMM on `rows` sampled output rows.
struct Fp8GemmCheck {
  double ratio = 0;        // the largest |observed| / P
  double worst_ratio = 0;  // the largest |observed| / W
  double rel_error = 0;    // ‖observed‖₂ / ‖bf16 product‖₂ over the sampled elements
  int64_t elements = 0;
};
Fp8GemmCheck check_fp8_gemm(const Fp8GemmView& v, int64_t rows, double lambda);

class Fp8Sentinel final : public StepObserver {
 public:
  // model: has fp8 linears; world: every rank (the checks of a GEMM's shards are combined);
  // record: rank 0's metrics (may be empty); out: rank 0's console.
  Fp8Sentinel(Model& model, comm::Communicator& world, const Fp8SentinelRule& rule, FindingLog& log, FaultAction action,
              std::function<void(const nlohmann::json&)> record, std::ostream& out);
  ~Fp8Sentinel() override;

  void begin_step(int64_t step) override;  // installs the GEMM tap on check steps
  void end_step(const StepRecord& r) override;
  void rolled_back(int64_t step) override;

  int64_t checks() const { return checks_; }
  double seconds() const { return seconds_; }  // spent in shadow checks on this rank

 private:
  void judge_statistics(const StepRecord& r);
  void judge_checks(const StepRecord& r);
  // "amax 3.1 3.9 … scale 140 …" over the kept history of tensor i.
  std::string history_text(size_t i) const;

  Model& model_;
  comm::Communicator& world_;
  Fp8SentinelRule rule_;
  FindingLog& log_;
  FaultAction action_;
  std::function<void(const nlohmann::json&)> record_;
  std::ostream& out_;
  bool checking_ = false;
  std::map<std::string, Fp8GemmCheck> step_checks_;  // "LINEAR/GEMM" -> this rank's check
  std::vector<std::deque<std::pair<float, float>>> history_;  // per tensor: (amax, scale) per step
  std::set<std::string> alarmed_;                  // GEMM checks reported and still past their bound
  std::map<std::string, int64_t> streaks_;         // statistics: steps in a row past their bound
  int64_t checks_ = 0;
  double seconds_ = 0;
};

}  // namespace lockstep::detect
