// `lockstep verify step`: one training step in the trainer and in the reference, compared tensor
// by tensor (the verification ladder's rung 2, docs/architecture.md).
//
// The trainer side is src/model + src/optim exactly as src/train/trainer.cpp runs a step
// (micro-batches, exact loss sum / tokens, finish_grads, clip_grad_norm, AdamW), observed through
// the model's TensorHook. The reference side is reference/gpt.hpp on the same parameters, moments and
// batch: canonical mode against the CanonicalF32 emulation run end to end (bitwise), fast mode
// against Bounded<mpfr> (or Bounded<double>) re-anchored on the trainer's tensor at every hook point, so that each
// tensor's bound covers the ops since the previous hook point (op-local bounds: first-order
// worst-case bounds carried through the whole model grow ~100x per layer and become vacuous);
// tightness and ulp distance are reported.
// Not here: printing (verify/report.hpp), argument parsing (src/cli/cmd_verify.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/gpt.hpp"
#include "src/train/config.hpp"
#include "verify/report.hpp"

namespace lockstep::verify {

// Everything a step depends on.
struct StepState {
  RunConfig cfg;                          // [model], [train] (mode, batch, schedule, AdamW, clip)
  ModelDesc model;                        // the layer list (describe_model(cfg.model), or edited)
  int64_t step = 0;                       // 0-based index of the step to run (= steps done)
  std::vector<float> params, m, v;        // flat, Model::param_layout() order
  nlohmann::json fp8;                     // an fp8 run's scaling state (src/model/fp8_state.hpp); null: fresh
  // A MoE run's selection biases ("layer/3/moe" -> one per expert; [model] moe_bias_update), as its
  // checkpoint holds them; a layer missing: zeros (a fresh run's).
  std::map<std::string, std::vector<float>> moe_biases;
  std::vector<int32_t> inputs, targets;   // (B, T) the step's global batch
};

// The Bounded reference's scalar in fast mode: MPFR (the verification ladder's default; exact to
// far beyond fp32) or double with its own roundings counted in the bound (reference/bounded.hpp
// kBoundedDoubleU): a few hundred times faster, the bounds looser by 2^-27 relative.
enum class ReferenceType { kMpfr, kDouble };

struct StepOptions {
  ReferenceType reference_type = ReferenceType::kMpfr;
  unsigned reference_bits = 256;  // MPFR precision of the Bounded reference (fast mode)
  double lambda = 0;              // > 0: probabilistic bounds γ̃_n(λ) (reference/bounded.hpp), fast mode
  std::vector<int64_t> layers;    // activation rows of these layers only (empty: all)
  bool force = false;             // run even when the estimate exceeds max_seconds
  double max_seconds = 900;       // refuse (ConfigError with the estimate) above this
  std::string perturb;            // test-only: flip bit `perturb_bit` of element 0 of this
  int perturb_bit = 0;            // trainer tensor before comparing (bit 0: a one-ulp error,
                                  // which canonical mode must catch; fast mode needs a larger one)
};

// An fp8 run's delayed scales at the step ("LINEAR/ROLE" -> scale): s.fp8's, or a fresh state's
// (1.0); empty for other recipes.
std::map<std::string, float> fp8_scales(const StepState& s);
// The selection biases of every MoE layer that has them: s.moe_biases', or zeros.
std::map<std::string, std::vector<float>> selection_biases(const StepState& s);

// What the reference needs besides the state: its own hyper-parameters of this step (the learning
// rate and AdamW bias corrections at s.step, the decayed classes: reference/schedule.hpp, from the
// config's numbers, not src/optim's), loss segments per micro-batch.
struct StepSetup {
  reference::StepHyper hyper;
  float dloss = 0;
  std::vector<int64_t> loss_segments;
  int64_t B = 0, MB = 0, T = 0;
};
StepSetup step_setup(const StepState& s);

// The state before step 0: parameters initialised from [model] seed, zero moments, the sampler's
// first batch (what a run without a checkpoint starts from).
StepState initial_step_state(const RunConfig& cfg);

// Reads the checkpoint in `dir` (a step_* directory, or a root: its newest valid checkpoint):
// parameters, AdamW moments, step and sampler position, then the batch of that step from
// cfg.data.train. ConfigError when the checkpoint's [model] differs from cfg's; DataError on a
// bad checkpoint or data file.
StepState load_step_state(const RunConfig& cfg, const std::string& dir);

// Estimated seconds for the reference step of `cfg` in the mode's reference type: the model's
// FLOPs per step times the measured cost of one multiply-add in that type.
double estimate_reference_seconds(const RunConfig& cfg, const StepOptions& opt);

// Runs and compares. ConfigError when the estimate exceeds max_seconds (unless force) or perturb
// names no tensor.
StepReport verify_step(const StepState& state, const StepOptions& opt);

}  // namespace lockstep::verify
