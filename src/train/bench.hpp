// `lockstep bench`: the training step timed on one process — warm-up steps, then timed steps,
// summarised as median and spread of step time, tokens/s, achieved FLOP/s, MFU against an fp32
// GEMM peak measured in the same process with the same thread count, a per-phase breakdown and
// the peak resident memory and the minor page faults inside the timed steps (the steady state
// should have none: no allocation, no buffer touched for the first time).
//
// The step is the trainer's single-process step (src/train/trainer.cpp): zero_grad,
// forward_backward_batch over the micro-batches, finish_grads, clip_grad_norm, AdamW update.
// Phases: "forward" is a separate forward-only pass (Model::eval_loss) over the same batch, timed
// after each step and not part of the step time; "backward" is forward_backward − forward (the
// model does not expose a timer between its forward and backward); "optimizer" is clip + AdamW.
// Communication is 0 (one process). Verification: the detectors the trainer attaches, each timed
// at its default interval outside the step, as the cost it adds per step: [verify] replicas (every
// step under dp or tp, each rank block-hashes its parameters and all-gathers 96 bytes; the
// hash is timed here, the all-gather is latency only and needs ranks), the numeric monitors
// (non-finite and spikes of the loss and gradient norm) and the state at rest (parameters and
// moments hashed after the update and again before the next step), all in verify/detect/; and,
// with --verify.abft=true, the GEMM checksums (inside the step: timed by the checker itself, their
// share given against the step without them); with --verify.on_fault=rollback, the step's snapshot.
//
// The peak is the fastest of OpenBLAS sgemm (whose kernel the environment may hold back: a
// DYNAMIC_ARCH build that does not recognise the CPU falls back to an old core such as Prescott,
// OPENBLAS_CORETYPE may pin AVX2) and Lockstep's canonical and fast GEMMs (the widest ISA the CPU
// has), so that no kernel of the step outruns it; the report names every figure and kernel, and
// the GEMM fast mode runs.
// Tokens: the [data] train file through the trainer's sampler when one is configured; otherwise
// synthetic tokens, uniformly random over the vocabulary from SplitMix64(train.seed), generated
// in memory (the step's cost does not depend on the token values).
// Not here: multi-rank timing, the PyTorch comparison (scripts/compare_pytorch.sh).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/splitmix64.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "src/train/config.hpp"
#include "kernels/cpu/gemm_peak.hpp"
#include "src/train/metrics.hpp"

namespace lockstep {

class Model;
class AdamW;
namespace comm {
class Communicator;
}

struct BenchOptions {
  int64_t warmup = 2;  // untimed steps first (page faults, thread start, caches)
  int64_t steps = 10;  // timed steps
  // When set, every step's batch (warm-up steps included) is written there, so that another
  // trainer can be fed exactly the same tokens (scripts/compare_pytorch.sh): int32 little-endian,
  // shape (warmup + steps, 2, batch_size, seq_len), [s][0] the inputs and [s][1] the targets of
  // step s. No header: the shape is in the JSON report ("tokens_shape").
  std::string tokens_out;
};

// Median, quartiles and extremes of a sample (linear interpolation between order statistics).
struct BenchStats {
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0;
};
BenchStats stats_of(std::vector<double> x);  // x not empty
nlohmann::json stats_json(const BenchStats& s);
// "  NAME  median UNIT   IQR [q1, q3]   min ...   max ...", the name in `width` columns.
void print_stats(std::ostream& out, const std::string& name, const BenchStats& s, int width = 18,
                 const char* unit = " ms");

struct BenchResult {
  int64_t threads = 0;
  std::string isa, fast_gemm, blas_core;  // the backend's choices (kernels/cpu/cpu_backend.hpp)
  std::string bf16_kernel;                // the instructions of bf16 products (kernels/cpu/matmul.hpp)
  int64_t params = 0;
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;  // 6·N + 12·L·C·T (Model::flops_per_token)
  double peak_gflops = 0;      // fp32 GEMM peak: measured.gflops unless [train] peak_gflops is set
  bool peak_measured = true;
  GemmPeak measured;           // the higher of two measurements, before and after the timed steps
  BenchStats step_ms;          // timed step: forward_backward + optimizer
  BenchStats forward_ms;       // forward-only pass, separate from the step
  BenchStats forward_backward_ms;
  BenchStats optimizer_ms;
  BenchStats replica_hash_ms;  // verification: the replica check's parameter hash (every step)
  BenchStats numeric_monitors_ms;  // verification: the non-finite and spike monitors (every step)
  BenchStats state_at_rest_ms;     // verification: the state's hashes after the update and before the next step
  // [verify] abft (off by default): the checks inside the step (its step_ms includes them), their
  // median per step, the products checked per step and the largest passing |checksum − predicted|
  // over its threshold (the bound's tightness).
  bool abft = false;
  BenchStats abft_ms;
  int64_t abft_checks_per_step = 0;
  double abft_tightness = 0;
  int64_t abft_faults = 0;  // failed checks (on a clean benchmark: false alarms, or this machine's faults)
  bool rollback = false;     // [verify] on_fault = "rollback": the step's snapshot, timed outside the step
  BenchStats snapshot_ms;
  // [verify] buddy_every = N (> 0): the witness's hashing of every tensor the model shows (inside
  // the step here, as in a buddy step's runs; its step_ms includes it) and the tensors per step.
  int64_t buddy_every = 0;
  BenchStats witness_ms;
  int64_t witness_tensors = 0;
  // [verify] reference_every = N (> 0): one op re-checked against the Bounded<double> reference in
  // every step here (inside the step: its step_ms includes it), the ops in turn; per check.
  int64_t reference_every = 0;
  BenchStats reference_ms;
  double reference_tightness = 0;  // the largest passing |trainer − reference| / bound
  // An fp8 run: its statistics combined and the histories rolled every step (in the step), and
  // the fp8 sentinel's shadow check of every fp8 GEMM run every step here (outside the step time)
  // and charged at its interval, fp8_sentinel_every; and the per-step judgement of the statistics.
  bool fp8 = false;
  int64_t fp8_sentinel_every = 0;
  BenchStats fp8_check_ms, fp8_statistics_ms;
  double backward_ms = 0;      // median forward_backward − median forward (derived)
  double tokens_per_s = 0;     // at the median step time
  double achieved_gflops = 0;  // tokens_per_s · flops_per_token
  double mfu = 0;              // achieved / peak
  double peak_memory_mib = 0;
  int64_t step_page_faults = 0;  // minor page faults inside the timed steps, all of them together
  bool synthetic_tokens = true;
  float last_loss = 0;
  uint64_t params_xxh64 = 0;  // the parameters after the last step (the replica check's hash)
  std::vector<float> losses;  // every step's mean loss, warm-up steps included, in step order
  std::vector<float> lrs;     // the learning rate each step used (warm-up + cosine schedule)

  // The detectors' medians together: the per-step cost of the verification at its defaults.
  double verification_ms() const {
    return replica_hash_ms.median + numeric_monitors_ms.median + state_at_rest_ms.median;
  }
  // The GEMM checksums' share of the step without them.
  double abft_fraction() const { return abft_ms.median / (step_ms.median - abft_ms.median); }
  // Buddy replay's share of the step at its interval: every N steps one more step, both runs'
  // witnesses and a copy of the state (the snapshot's cost), against the step without the witness.
  // The reference check's share of the step at its interval, against the step without it.
  double reference_fraction() const {
    return reference_ms.median / static_cast<double>(reference_every) / (step_ms.median - reference_ms.median);
  }
  // The fp8 sentinel's share of the step at its interval (the statistics every step, the shadow
  // check every fp8_sentinel_every steps).
  double fp8_sentinel_fraction() const {
    const double check = fp8_sentinel_every > 0 ? fp8_check_ms.median / static_cast<double>(fp8_sentinel_every) : 0;
    return (check + fp8_statistics_ms.median) / step_ms.median;
  }
  double buddy_fraction() const {
    const double step = step_ms.median - witness_ms.median;
    return (step + 2 * witness_ms.median + snapshot_ms.median) / static_cast<double>(buddy_every) / step;
  }
  nlohmann::json to_json(const RunConfig& cfg) const;
};

// ConfigError naming the option where the step counts are out of range.
void check_options(const BenchOptions& opt);

// Runs the benchmark for `cfg` (loaded with ConfigUse::kBench), printing a report to `out`.
BenchResult run_bench(const RunConfig& cfg, BenchOptions opt, std::ostream& out);

// The batches a benchmark steps on: the [data] train file through the trainer's sampler, or
// synthetic tokens (uniform over the vocabulary from the seed; see above).
class BenchBatches {
 public:
  explicit BenchBatches(const RunConfig& cfg);
  bool synthetic() const { return !sampler_.has_value(); }
  // The next batch, (batch_size, seq_len) inputs and their targets.
  void next();
  const std::vector<int32_t>& inputs() const { return inputs_; }
  const std::vector<int32_t>& targets() const { return targets_; }

 private:
  int64_t B_, T_, V_;
  std::vector<int32_t> inputs_, targets_;
  std::optional<data::TokenFile> file_;
  std::optional<data::TrainSampler> sampler_;
  SplitMix64 rng_;
};

// One training step as the benchmark times it: zeroing the gradients, forward and backward over
// the micro-batches (an fp8 run's statistics combined), then clipping and AdamW; the parts' times.
struct StepTimes {
  double forward_backward_ms = 0, optimizer_ms = 0;
  float loss = 0, grad_norm = 0;
};
StepTimes timed_step(Model& model, AdamW& adamw, const TrainConfig& tc, const BenchBatches& batch, float lr,
                     int64_t step, comm::Communicator& self);

}  // namespace lockstep
