// Sampled reference checks ([verify] reference_every = N): every N-th step one op of the model's
// forward, taken in turn, is computed again for the first rows of the step's first micro-batch in
// Bounded<double> (reference/), on the very inputs the trainer's op read, and every element of its
// output held to |trainer − y*| <= bound — the op-local check of `verify step` on a sample, while
// the run trains (NUMERICS.md, "Bounded<T>": the bound holds for any summation order, so canonical
// and fast mode alike). A kernel that computes the same wrong result on every rank and in every run
// (a bug, a miscompiled instruction, a unit broken the same way everywhere) agrees with its replays
// and its buddies; only a reference sees it.
//
// The ops: the norms, the linear layers (qkv where positions are learned: RoPE's rotation is not
// re-checked), the activation (GELU or SwiGLU), the projections with their residual add, the head,
// a MoE layer's router. Not attention, the embedding, the loss or a MoE layer's experts (their rows
// are no hook). Each pipeline stage checks its own ops in turn (the
// first op of a stage, whose input is the previous stage's, is left out). Under tensor parallelism each rank checks its own
// shard's ops (a column-parallel product, the activation, the head's vocabulary rows, the norms
// without sequence parallelism); the row-parallel projections, whose result is a sum over the tp
// group, are left out. Rows: as many as fit kBudget multiply-adds of the op (one at least), so a
// check costs about the same for every op (bench: `--verify.reference_every=1`). Under a bf16 recipe
// the reference rounds where the model does (the weight copy of a bf16 linear, what it writes, a
// norm's or the activation's output that a bf16 linear reads; reference/cast.hpp's bounds).
// Not here: the reference ops (reference/), when the model shows its tensors (the hook, layer.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "reference/bounded.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/tensor_view.hpp"
#include "src/model/model.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

// One op the check can re-compute: the hook tensor it writes and those it reads.
struct SampledOp {
  enum class Kind { kNorm, kLinear, kActivation, kLinearResidual };
  Kind kind = Kind::kNorm;
  std::string output{};
  std::vector<std::string> inputs{};  // kLinearResidual: the branch, then the stream it adds to
  std::string weight{}, bias{};       // parameter names ("" : none)
  NormKind norm = NormKind::kLayerNorm;
  float eps = 0;
  FfnKind ffn = FfnKind::kGelu;
  // The linear (precision.hpp's name) in whose precision the output is computed (a linear, a
  // projection) or stored (a norm or the activation: the linear that reads it); "": fp32 whatever
  // the recipe (a MoE router, and the norm it reads).
  std::string linear{};
};

// The ops of `model` that a rank of a tp group of `tp` ranks (sp: sequence parallelism) can check:
// of a pipeline stage, those whose output and inputs its layers show.
std::vector<SampledOp> sampled_ops(const Model& model, int64_t tp, bool sp);

struct ReferenceStats {
  int64_t checks = 0;
  double max_ratio = 0;  // largest |trainer − y*| / bound of a passing check
  double seconds = 0;
};

class ReferenceCheck final : public StepObserver {
 public:
  // recipe: the model's precision recipe; a bf16 linear's reference reads bf16 copies of its weight
  // and rounds what it writes, as the model does (reference/layers.hpp); an fp8 linear's quantizes
  // them as well, with the step's delayed scales (the model's Fp8State) or its own amax.
  ReferenceCheck(const Model& model, std::vector<SampledOp> ops, PrecisionRecipe recipe, int64_t every,
                 comm::Communicator& world, FindingLog& log, FaultAction action)
      : model_(model), ops_(std::move(ops)), recipe_(std::move(recipe)), every_(every), world_(world), log_(log),
        action_(action) {}

  void begin_step(int64_t step) override;
  // The model's hook calls it with every tensor (after any injection: what the next op reads).
  void observe(std::string_view name, const TensorView& t);
  // Every rank judges its check; the ranks agree on the finding.
  void after_reduce(int64_t step, float loss) override;
  const ReferenceStats& stats() const { return stats_; }

 private:
  void check(const TensorView& out);
  // x (rows × cols) as the op's fp8 linear quantizes tensor `role` for its fprop; amax: the whole
  // tensor's (current scaling).
  std::vector<reference::Bounded<double>> fp8_quantized(Fp8Role role, const std::vector<reference::Bounded<double>>& x,
                                                        int64_t rows, int64_t cols, double amax) const;

  const Model& model_;
  std::vector<SampledOp> ops_;
  PrecisionRecipe recipe_;
  int64_t every_;
  comm::Communicator& world_;
  FindingLog& log_;
  FaultAction action_;
  bool due_ = false;               // this step is checked (on every rank: after_reduce gathers)
  const SampledOp* op_ = nullptr;  // this step's, while it has not been checked
  int64_t rows_ = 0;
  std::map<std::string, std::vector<float>> inputs_;  // its inputs' first rows
  double input_amax_ = 0;                             // the largest |x| of its first input, all rows
  bool checked_ = false;
  double ratio_ = 0;  // this step's largest |trainer − y*| / bound
  int64_t worst_ = -1;  // the element of the worst, or -1
  ReferenceStats stats_;
};

}  // namespace lockstep::detect
