// The run configuration: a TOML file with sections [model] [data] [train] [fp8] [checkpoint] [log]
// [eval] [parallel] [verify] [dump] [inject], plus command-line overrides `--section.key=value`. Every key is
// declared once, with its type; an unknown section or key, a value of the wrong type or out of
// range is a ConfigError naming the file (or the override), the key and the expectation.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops/mode.hpp"
#include "src/model/config.hpp"
#include "src/model/precision.hpp"
#include "src/optim/adamw.hpp"

namespace lockstep {

struct DataConfig {
  std::string train;  // llm.c token file
  std::string val;    // llm.c token file ("" = no evaluation)
};

struct TrainConfig {
  int64_t steps = 100;
  // Stop after this 0-based step, as if the run ended there, of a run configured for `steps` (the
  // LR schedule stays that of `steps`): a prefix of the full run (bisect). -1 = run every step.
  int64_t stop_after = -1;
  int64_t batch_size = 8;        // sequences per optimizer step (global batch)
  int64_t micro_batch_size = 0;  // sequences per forward/backward (0 = batch_size)
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup = 0;
  double weight_decay = 0.1;
  // The parameter classes weight decay applies to (src/optim/decay_policy.hpp), comma-separated
  // from matrices, embeddings, norms, biases; "none" for none.
  std::string weight_decay_on = "matrices,embeddings";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 = off
  uint64_t seed = 1234;    // data order
  Mode mode = Mode::kCanonical;
  int64_t threads = 0;       // 0 = all cores
  std::string isa = "auto";  // CPU kernels' SIMD: auto | avx2 | avx512 (canonical bits are the same)
  // Fast mode's GEMM: auto | openblas | lockstep (auto: Lockstep's where OpenBLAS's kernel is
  // narrower than the CPU's vectors; kernels/cpu/sgemm_threads.hpp)
  std::string fast_gemm = "auto";
  double peak_gflops = 0;    // 0 = measure an fp32 GEMM peak at start-up
  // Where that measurement is kept between runs (src/train/kernel_cache.hpp): auto | off | a path.
  std::string kernel_cache = "auto";
  // The precision recipe (src/model/precision.hpp): fp32 | bf16, and the linears bf16 leaves in
  // fp32 (comma-separated names or prefixes, e.g. "head,layer/0").
  Precision precision = Precision::kF32;
  std::string fp32_linears;
  // false (bf16 only): the parameters themselves are bf16, AdamW's result stochastically rounded
  // (src/model/precision.hpp); true: fp32 master weights.
  bool master_weights = true;
  // A safetensors file of initial parameters for a run that does not resume (src/train/init_from.hpp).
  std::string init_from;
  // Activation recomputation (src/model/layer.hpp, Recompute): "none" | "selective" (attention
  // sub-layers) | "full" (attention and MLP sub-layers).
  std::string recompute = "none";
  // [fp8], the recipe of precision = "fp8" (src/model/fp8_recipe.hpp). A section of its own, kept
  // here because the precision recipe is the train section's.
  struct Fp8 {
    std::string recipe = "delayed";           // delayed | current | mxfp8 | blockwise
    std::string format = "hybrid";            // hybrid (e5m2 gradients) | e4m3
    int64_t amax_history_len = 1024;          // delayed
    std::string amax_compute_algo = "max";    // delayed: max | most_recent
    int64_t margin = 0;                       // delayed, current
    bool power_of_two_scales = false;         // delayed, current, blockwise
    std::string gemms = "fprop,dgrad,wgrad";  // the GEMMs that read fp8
    std::string accumulate = "fp32";          // fp32 | hopper (kernels/ops/fp8_accumulation.hpp)
    std::string bf16_linears = "head";        // linears kept in bf16 (names or prefixes; "" none)
  } fp8;

  int64_t micro_batch() const { return micro_batch_size > 0 ? micro_batch_size : batch_size; }
  PrecisionRecipe precision_recipe() const;
  // The optimizer's fp32 hyperparameters and decay policy, as every step that trains uses them.
  AdamWConfig adamw() const;
};

struct CheckpointConfig {
  std::string dir;    // "" = no checkpoints
  int64_t every = 0;  // steps between checkpoints (0 = only at the end)
  // every = "auto": the interval Daly's formula gives for the measured save stall, the mean step
  // time and the job's mean time between failures (src/train/checkpoint_interval.hpp).
  bool every_auto = false;
  double mtbf_hours = 24;
  int64_t keep = 3;   // newest checkpoints retained (0 = all)
  int64_t keep_every = 0;  // checkpoints of steps that are multiples of this kept as well (0 = none)
  bool async = false;      // written by a thread from a copy in host memory while training goes on
};

struct LogConfig {
  std::string metrics;  // JSONL file ("" = none)
  int64_t every = 1;    // console line every N steps
  bool moe = true;      // a MoE model's per-expert statistics (src/train/moe_statistics.hpp)
};

struct EvalConfig {
  int64_t every = 0;    // steps between evaluations (0 = only at the end)
  int64_t batches = 8;  // micro-batches of validation data per evaluation
};

// Parallel layout (src/parallel/mesh.hpp) and data-parallel options (data_parallel.hpp).
struct ParallelConfig {
  int64_t dp = 0;  // data-parallel ranks (0 = all ranks left by the other axes)
  int64_t tp = 1, pp = 1, ep = 1, cp = 1;
  std::string cp_comm = "all_gather";  // how cp ranks exchange keys and values: "all_gather" | "p2p" (the ring)
  bool sp = false;                  // sequence parallel: norms and residuals split over tp by tokens
  int64_t zero = 0;                 // 0: replicated AdamW; 1: sharded AdamW state; 2: + sharded gradients
  std::string reduce = "exact";     // gradient reduction: "exact" (rank-count independent) | "fast"
  double bucket_mb = 25;            // gradient reduction bucket (MiB of fp32 gradient), PyTorch DDP's default
  bool overlap = true;              // reduce buckets on a communication thread during the backward
  double timeout_s = 300;           // watchdog: a collective waiting longer ends the job
  // Pipeline parallelism (src/train/pipeline.hpp): the schedule of a step's passes
  // (src/parallel/pipeline_schedule.hpp; the trainer runs "gpipe" and "1f1b"), model chunks a rank
  // ("interleaved"), and the layers of each stage by hand ("" = balanced by FLOPs).
  std::string schedule = "1f1b";
  int64_t virtual_stages = 1;
  std::string stage_layers;
};

// Detectors while training (verify/detect/): what is checked and what a finding does. The
// non-finite monitor of loss and gradient norm is always on.
struct VerifyConfig {
  bool replicas = true;            // hash dp replicas and tp-replicated tensors every step
  bool state_at_rest = true;       // hash parameters and moments after the update, again before the next step
  bool spikes = true;              // loss and gradient-norm spikes (verify/detect/spikes.hpp)
  bool abft = false;               // checksums of every linear layer's products (verify/detect/abft.hpp)
  bool collectives = false;        // checksums beside every dp and tp message (verify/detect/verified_comm.hpp)
  int64_t spike_window = 50;       // steps of history
  double loss_spike_threshold = 6;        // robust z-score above which a loss is a spike
  double grad_norm_spike_threshold = 20;  // the same for the gradient norm (see verify/detect/spikes.hpp)
  std::string on_fault = "stop";   // non-finite values, corruption: "stop" | "warn" | "rollback"
  int64_t max_replays = 2;         // rollback: replays of one step before its fault is persistent
  int64_t replay_every = 0;        // run every N-th step twice from its snapshot and compare (0: off)
  int64_t buddy_every = 0;         // every N-th step each dp group computes its neighbour's batch too (0: off)
  int64_t reference_every = 0;     // every N-th step one op re-checked against the Bounded<double> reference (0: off)
  std::string on_spike = "warn";   // spikes: "warn" | "stop"
  // Slow ranks (verify/detect/stragglers.hpp): compute time per step against the median rank's,
  // compared every straggler_window steps; a finding after straggler_patience windows in a row over
  // straggler_threshold. on_straggler "stop": the run then saves a checkpoint after its next step and
  // ends with detect::kExitSlowRank, for `lockstep launch --spares` to restart it without the rank.
  bool stragglers = true;
  std::string on_straggler = "warn";  // "warn" | "stop"
  int64_t straggler_window = 20;
  double straggler_threshold = 1.25;
  int64_t straggler_patience = 3;
  // The fp8 sentinel (verify/detect/fp8_sentinel.hpp), on in fp8 runs: statistics every step,
  // a shadow recompute of each fp8 GEMM on sampled rows every fp8_sentinel_every steps (0: none).
  int64_t fp8_sentinel_every = 20;
  int64_t fp8_sentinel_rows = 4;
  double fp8_sentinel_lambda = 8;
  double fp8_saturation_threshold = 1e-2;
  double fp8_underflow_threshold = 0.5;
  int64_t fp8_patience = 3;     // steps a statistic stays past its threshold before a finding
  std::string on_fp8 = "warn";  // "warn" | "stop"
};

// Tensor dumps for `lockstep diff` (verify/core/dump.hpp); off (and free: no hook) while dir is "".
struct DumpConfig {
  std::string dir;      // the dump directory ("" = off); must not hold a dump already
  std::string tensors;  // comma-separated globs over hook names, '*' matching '/' too ("" = all)
  std::string steps;    // 0-based steps, e.g. "0-20" or "3,7,10-12" ("" = every step)
};

// One planted divergence or fault (src/train/inject.hpp); off while site and kind are "".
// One planted fault or divergence (src/train/inject.hpp); off while kind is "".
struct InjectConfig {
  std::string site;  // hook name (e.g. layer/2/mlp/res) or param/NAME; none for exit and hang
  int64_t step = 0;  // 0-based optimizer step
  std::string kind;  // bitflip:bit=B[,index=I] | order | cast:bf16|f16|e4m3|e5m2 | exit | hang
  int64_t rank = -1; // world rank that injects (-1 = every rank)
  bool persistent = false;  // every step from `step` on, replays included (a broken device); else once
  std::string campaign;      // a fault campaign's faults (JSON lines; src/train/campaign_recorder.hpp)
  std::string campaign_out;  // where its records go (JSON lines, world rank 0)
};

struct RunConfig {
  std::string source;  // the config file, for messages
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LogConfig log;
  EvalConfig eval;
  ParallelConfig parallel;
  VerifyConfig verify;
  DumpConfig dump;
  InjectConfig inject;

  nlohmann::json to_json() const;
};

// What the configuration is loaded for: training needs a [data] train token file; `lockstep bench`
// may leave it empty and time the step on synthetic tokens (src/train/bench.hpp).
enum class ConfigUse { kTrain, kBench };

// Parses `path` and applies `overrides` ("section.key" -> value text) in order; validates.
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides,
                          ConfigUse use = ConfigUse::kTrain);
// The same from a configuration as RunConfig::to_json wrote it (a checkpoint's); `source` names it
// in messages.
RunConfig run_config_of_json(const nlohmann::json& config, const std::string& source,
                             const std::vector<std::pair<std::string, std::string>>& overrides = {},
                             ConfigUse use = ConfigUse::kTrain);

// The first [model] key whose value in `then` (a checkpoint's configuration, as to_json wrote it;
// a key it predates had its default) differs from `now`'s, as "KEY = THEN, ... has NOW" with
// `now_name` for the second ("this run"); empty when the models are the same.
std::string model_config_difference(const nlohmann::json& then, const nlohmann::json& now, const std::string& now_name);

}  // namespace lockstep
