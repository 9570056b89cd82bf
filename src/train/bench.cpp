#include "src/train/bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <optional>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"
#include "src/data/sampler.hpp"
#include "src/core/splitmix64.hpp"
#include "src/data/token_file.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/optim/grad_clip.hpp"
#include "src/train/detectors.hpp"
#include "src/train/fp8_statistics.hpp"
#include "src/train/metrics.hpp"
#include "src/train/rollback.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/abft.hpp"
#include "verify/detect/fp8_sentinel.hpp"
#include "verify/detect/buddy.hpp"
#include "verify/detect/checksum.hpp"
#include "verify/detect/finding.hpp"
#include "verify/detect/nonfinite.hpp"
#include "verify/detect/reference_check.hpp"
#include "verify/detect/spikes.hpp"
#include "verify/detect/state_at_rest.hpp"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Minor page faults of the process so far (every thread): a fault inside the step is memory the
// step touched for the first time, i.e. an allocation or a buffer first used after warm-up.
int64_t minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt);
}

}  // namespace

nlohmann::json stats_json(const BenchStats& s) {
  return {{"median", s.median}, {"q1", s.q1}, {"q3", s.q3}, {"min", s.min}, {"max", s.max}};
}

void print_stats(std::ostream& out, const std::string& name, const BenchStats& s, int width, const char* unit) {
  out << "  " << std::left << std::setw(width) << name << std::right << std::fixed << std::setprecision(2)
      << std::setw(10) << s.median << unit << "   IQR [" << s.q1 << ", " << s.q3 << "]   min " << s.min
      << "   max " << s.max << "\n";
}

BenchStats stats_of(std::vector<double> x) {
  LS_CHECK(!x.empty(), "no samples");
  std::sort(x.begin(), x.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(x.size() - 1);
    const auto lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, x.size() - 1);
    return x[lo] + (pos - static_cast<double>(lo)) * (x[hi] - x[lo]);
  };
  return {quantile(0.5), quantile(0.25), quantile(0.75), x.front(), x.back()};
}

nlohmann::json BenchResult::to_json(const RunConfig& cfg) const {
  // A detector timed at its default interval of one step.
  const auto detector = [&](const char* feature, const char* by_default, const BenchStats& ms) {
    return nlohmann::json{{"feature", feature},
                          {"default", by_default},
                          {"interval_steps", 1},
                          {"ms", stats_json(ms)},
                          {"fraction_of_step", ms.median / step_ms.median}};
  };
  return {{"config", cfg.source},
          {"mode", mode_name(cfg.train.mode)},
          {"precision", cfg.train.precision_recipe().describe()},
          {"threads", threads},
          {"isa", isa},
          {"params", params},
          {"tokens_per_step", tokens_per_step},
          {"synthetic_tokens", synthetic_tokens},
          {"flops_per_token", flops_per_token},
          {"flops_formula", "6*N + 12*L*d_model*seq_len per token (N: parameters in matmuls, tied head once)"},
          {"peak_gflops", peak_gflops},
          {"openblas_core", blas_core},
          {"peak_openblas_gflops", measured.openblas_gflops},
          {"peak_canonical_gflops", measured.canonical_gflops},
          {"peak_lockstep_fast_gflops", measured.fast_gflops},
          {"peak_bf16_dot_gflops", measured.bf16_dot_gflops},
          {"fast_gemm", fast_gemm},
          {"bf16_kernel", bf16_kernel},
          {"peak_source", peak_measured ? "measured: " + measured.describe() +
                                              ", same process and threads, each the higher of before and "
                                              "after the timed steps"
                                        : std::string("configured: [train] peak_gflops")},
          {"step_ms_median", step_ms.median},
          {"step_ms", stats_json(step_ms)},
          {"tokens_per_s", tokens_per_s},
          {"achieved_gflops", achieved_gflops},
          {"mfu", mfu},
          {"phases_ms",
           {{"forward", forward_ms.median},
            {"backward", backward_ms},
            {"optimizer", optimizer_ms.median},
            {"communication", 0.0},
            {"verification", verification_ms()}}},
          {"phase_notes",
           "forward: separate forward-only pass (eval_loss), not part of the step; backward: median "
           "forward_backward - median forward; communication: 0 on one process; verification: the "
           "periodic checks at their default interval, timed outside the step (see verification)"},
          {"verification",
           {{"replica_hash",
             detector("[verify] replicas: the parameters' block hash (verify/detect/checksum.hpp; the "
                      "state-at-rest check's, where that runs), then an all-gather of 96 bytes per rank over the world (32, three copies: verify/detect/agreed.hpp; not timed here: needs ranks)",
                      "on under dp or tp", replica_hash_ms)},
            {"numeric_monitors",
             detector("non-finite loss and gradient norm (always on), their spikes by a robust z-score "
                      "([verify] spikes)",
                      "on", numeric_monitors_ms)},
            {"state_at_rest",
             detector("[verify] state_at_rest: block hashes of the parameters and AdamW moments after the "
                      "update and again before the next step's forward",
                      "on", state_at_rest_ms)},
            {"abft",
             abft ? nlohmann::json{{"feature", "[verify] abft: row checksums of every linear layer's "
                                               "forward, input-gradient and weight-gradient products, inside the "
                                               "step (timed by the checker)"},
                                   {"default", "off"},
                                   {"interval_steps", 1},
                                   {"ms", stats_json(abft_ms)},
                                   {"products_per_step", abft_checks_per_step},
                                   {"fraction_of_step", abft_fraction()},
                                   {"fraction_note", "of the step without the checks (step_ms - abft ms)"},
                                   {"tightness", abft_tightness},
                                   {"failed", abft_faults}}
                  : nlohmann::json("off: --verify.abft=true times it")},
            {"rollback_snapshot",
             rollback ? detector("[verify] on_fault = \"rollback\": the in-memory copy of the parameters and AdamW "
                                 "moments before each step (src/train/rollback.hpp)",
                                 "off (on_fault = \"stop\")", snapshot_ms)
                      : nlohmann::json("off: --verify.on_fault=rollback times it")},
            {"buddy_replay",
             buddy_every > 0
                 ? nlohmann::json{{"feature", "[verify] buddy_every: every N steps each dp group computes its "
                                              "neighbour's batch too; the witness hashes every tensor the model "
                                              "shows its hook (src/train/buddy_replay.hpp)"},
                                  {"default", "off"},
                                  {"interval_steps", buddy_every},
                                  {"witness_ms", stats_json(witness_ms)},
                                  {"witness_tensors_per_step", witness_tensors},
                                  {"snapshot_ms", stats_json(snapshot_ms)},
                                  {"fraction_of_step", buddy_fraction()},
                                  {"fraction_note", "(one more step + both runs' witnesses + a state copy) / N, of "
                                                    "the step without the witness; the witnesses' gather over the "
                                                    "world not included"}}
                 : nlohmann::json("off: --verify.buddy_every=N times it")},
            {"fp8_sentinel",
             fp8 ? nlohmann::json{{"feature", "the fp8 sentinel: per-tensor statistics judged every step, a shadow "
                                              "recompute of every fp8 GEMM on sampled rows against its bound every "
                                              "[verify] fp8_sentinel_every steps (verify/detect/fp8_sentinel.hpp)"},
                                  {"default", "on in fp8 runs"},
                                  {"interval_steps", fp8_sentinel_every},
                                  {"check_ms", stats_json(fp8_check_ms)},
                                  {"statistics_ms", stats_json(fp8_statistics_ms)},
                                  {"fraction_of_step", fp8_sentinel_fraction()}}
                 : nlohmann::json("off: an fp8 run ([train] precision = \"fp8\") times it")},
            {"reference_check",
             reference_every > 0
                 ? nlohmann::json{{"feature", "[verify] reference_every: one op of the forward re-computed for a "
                                              "sample of rows in Bounded<double> and held to its bound "
                                              "(verify/detect/reference_check.hpp)"},
                                  {"default", "off"},
                                  {"interval_steps", reference_every},
                                  {"ms", stats_json(reference_ms)},
                                  {"fraction_of_step", reference_fraction()},
                                  {"tightness", reference_tightness}}
                 : nlohmann::json("off: --verify.reference_every=N times it")}}},
          {"forward_ms", stats_json(forward_ms)},
          {"forward_backward_ms", stats_json(forward_backward_ms)},
          {"optimizer_ms", stats_json(optimizer_ms)},
          {"peak_memory_mib", peak_memory_mib},
          {"step_page_faults", step_page_faults},
          {"last_loss", last_loss},
          {"params_xxh64", hex64(params_xxh64)},
          {"losses", losses},
          {"lrs", lrs},
          {"tokens_shape", {static_cast<int64_t>(losses.size()), 2, cfg.train.batch_size, cfg.model.seq_len}}};
}

BenchBatches::BenchBatches(const RunConfig& cfg)
    : B_(cfg.train.batch_size),
      T_(cfg.model.seq_len),
      V_(cfg.model.vocab_size),
      inputs_(static_cast<size_t>(B_ * T_)),
      targets_(inputs_.size()),
      rng_(cfg.train.seed) {
  if (cfg.data.train.empty()) return;
  file_.emplace(cfg.data.train);
  file_->check_vocab(static_cast<int32_t>(V_));
  sampler_.emplace(*file_, T_, cfg.train.seed);
}

void BenchBatches::next() {
  if (sampler_) {
    sampler_->next_batch(B_, 0, B_, inputs_.data(), targets_.data());
    return;
  }
  // A synthetic sequence of T + 1 tokens per sample, shifted by one like a token file window.
  for (int64_t b = 0; b < B_; ++b) {
    auto prev = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(V_)));
    for (int64_t t = 0; t < T_; ++t) {
      const auto next = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(V_)));
      inputs_[static_cast<size_t>(b * T_ + t)] = prev;
      targets_[static_cast<size_t>(b * T_ + t)] = next;
      prev = next;
    }
  }
}

StepTimes timed_step(Model& model, AdamW& adamw, const TrainConfig& tc, const BenchBatches& batch, float lr,
                     int64_t step, comm::Communicator& self) {
  const auto tokens = static_cast<int64_t>(batch.inputs().size());
  const auto t0 = Clock::now();
  model.zero_grad();
  ChunkCombiner loss_sum;
  model.forward_backward_batch(batch.inputs().data(), batch.targets().data(), tc.batch_size, tc.micro_batch(), 0,
                               1.0f / static_cast<float>(tokens), loss_sum);
  if (Fp8State* fp8 = model.fp8()) combine_fp8_statistics(self, *fp8);
  model.finish_grads();
  StepTimes t;
  t.forward_backward_ms = ms_since(t0);
  const auto t1 = Clock::now();
  t.grad_norm = clip_grad_norm(model, static_cast<float>(tc.grad_clip));
  adamw.update(model, lr, step + 1);
  t.optimizer_ms = ms_since(t1);
  t.loss = loss_sum.finish() / static_cast<float>(tokens);
  return t;
}

void check_options(const BenchOptions& opt) {
  LS_REQUIRE(opt.steps >= 1, "--bench.steps (", opt.steps, ") must be >= 1");
  LS_REQUIRE(opt.warmup >= 0, "--bench.warmup (", opt.warmup, ") must be >= 0");
}

BenchResult run_bench(const RunConfig& cfg, BenchOptions opt, std::ostream& out) {
  check_options(opt);
  const TrainConfig& tc = cfg.train;
  BenchResult r;
  CpuBackend backend({tc.threads, tc.isa, tc.fast_gemm});
  r.threads = backend.threads();
  r.isa = backend.isa_name();
  r.fast_gemm = backend.fast_gemm_name();
  r.blas_core = backend.blas_core();

  const int64_t T = cfg.model.seq_len, B = tc.batch_size, MB = tc.micro_batch();
  r.tokens_per_step = B * T;
  BenchBatches batch(cfg);
  r.synthetic_tokens = batch.synthetic();
  const std::vector<int32_t>& inputs = batch.inputs();

  std::optional<detect::AbftBackend> abft;
  if (cfg.verify.abft) abft.emplace(backend, true);
  r.abft = cfg.verify.abft;
  Model model(cfg.model, tc.mode, MB,
              {.backend = abft ? static_cast<Backend*>(&*abft) : &backend, .precision = tc.precision_recipe()});
  if (abft) abft->name_weights(model);
  model.init_parameters();
  AdamW adamw(model, tc.adamw());
  const LrSchedule schedule{tc.lr, tc.min_lr, tc.warmup, opt.warmup + opt.steps};
  // The peak is measured before and after the timed steps and the higher figure kept: on a shared
  // machine one measurement can fall in a busy moment, and an underestimated peak inflates MFU.
  r.peak_measured = tc.peak_gflops <= 0;
  const bool bf16 = tc.precision == Precision::kBf16;
  if (r.peak_measured) {
    r.measured = backend.measure_gemm_peak();
    backend.choose_gemms(r.measured);
    r.fast_gemm = backend.fast_gemm_name();
  }
  r.bf16_kernel = backend.bf16_kernel_name();
  // bf16 operands: measured against the faster of the bf16 kernels.
  const Operands operands = bf16 ? Operands::kBf16 : Operands::kFp32;
  r.peak_gflops = r.peak_measured ? r.measured.gflops_for(operands) : tc.peak_gflops;
  r.flops_per_token = model.flops_per_token();
  r.params = model.num_params();

  out << "bench: " << cfg.source << "; " << model.num_params() << " parameters, " << std::fixed
      << std::setprecision(2) << r.flops_per_token / 1e6
      << " MFLOP/token (6*N + 12*L*d_model*seq_len); mode " << mode_name(tc.mode) << ", " << r.threads
      << " threads, " << r.isa << "; batch " << B << " x " << T
      << " tokens (micro-batch " << MB << "); "
      << (r.synthetic_tokens ? "synthetic uniform tokens" : "tokens from " + cfg.data.train) << "\n"
      << "precision: " << tc.precision_recipe().describe() << "\n"
      << (bf16 ? "bf16" : "fp32") << " GEMM peak " << std::setprecision(1) << r.peak_gflops << " GFLOP/s"
      << (r.peak_measured ? " (measured, same threads: " + r.measured.describe() + "; measured again after the steps)"
                          : " (configured)")
      << (r.peak_measured ? "; kernels: " + describe_choice(r.measured) : "; fast mode's GEMM " + r.fast_gemm)
      << "; " << opt.warmup << " warm-up + " << opt.steps << " timed steps\n";

  std::optional<durable_io::AtomicFile> tokens_file;
  if (!opt.tokens_out.empty()) tokens_file.emplace(opt.tokens_out);

  std::vector<double> step_ms, fwd_ms, fb_ms, optim_ms, hash_ms, monitor_ms, rest_ms, abft_ms, snapshot_ms,
      witness_ms, reference_ms, fp8_check_ms, fp8_statistics_ms;
  // [verify] on_fault = "rollback" (or buddy_every, which copies the state as well): the step's
  // in-memory snapshot (src/train/rollback.hpp), a copy of the parameters and moments before the
  // step, into buffers allocated once.
  r.rollback = cfg.verify.on_fault == "rollback";
  r.buddy_every = cfg.verify.buddy_every;
  // Buddy replay's witness (verify/detect/buddy.hpp), hashing in every step, timed in the hook.
  detect::TensorWitness witness;
  double witness_s = 0;
  std::vector<float> snap_params, snap_m, snap_v;
  if (r.rollback || r.buddy_every > 0) {
    snap_params.resize(static_cast<size_t>(model.num_params()));
    snap_m.resize(adamw.m().size());
    snap_v.resize(adamw.v().size());
  }
  // The run's numeric monitors as [verify] configures them, findings printed but never stopping.
  detect::FindingLog findings(out, {});
  detect::NonFiniteDetector nonfinite(findings, detect::FaultAction::kWarn);
  std::optional<detect::SpikeDetector> spikes;
  std::vector<StepObserver*> monitors = {&nonfinite};
  comm::SelfCommunicator self;
  // The reference check (verify/detect/reference_check.hpp), one op every step, in turn.
  r.reference_every = cfg.verify.reference_every;
  std::optional<detect::ReferenceCheck> reference;
  if (r.reference_every > 0) {
    reference.emplace(model, detect::sampled_ops(model, 1, false), cfg.train.precision_recipe(), 1, self, findings,
                      detect::FaultAction::kWarn);
  }
  if (r.buddy_every > 0 || reference) {
    model.set_hook([&](std::string_view name, const TensorView& t) {
      const auto t0 = Clock::now();
      witness.observe(name, t);
      witness_s += std::chrono::duration<double>(Clock::now() - t0).count();
      if (reference) reference->observe(name, t);
    });
  }
  std::optional<detect::StateAtRestDetector> at_rest;
  if (cfg.verify.state_at_rest) {
    at_rest.emplace(resting_state(model, adamw), self, findings, detect::FaultAction::kWarn);
  }
  if (cfg.verify.spikes) {
    spikes.emplace(spike_rule(cfg.verify), findings, detect::FaultAction::kWarn);
    monitors.push_back(&*spikes);
  }
  // An fp8 run's sentinel, checking every step (its cost is charged at its interval below).
  r.fp8 = model.fp8() != nullptr;
  r.fp8_sentinel_every = cfg.verify.fp8_sentinel_every;
  std::ostream quiet(nullptr);
  std::optional<detect::Fp8Sentinel> fp8_sentinel;
  if (r.fp8) {
    detect::Fp8SentinelRule rule = fp8_sentinel_rule(cfg.verify);
    rule.every = 1;
    fp8_sentinel.emplace(model, self, rule, findings, detect::FaultAction::kWarn, nullptr, quiet);
  }
  for (int64_t step = 0; step < opt.warmup + opt.steps; ++step) {
    // The state-at-rest check before the step's forward, outside the step's time.
    const auto t5 = Clock::now();
    if (at_rest) at_rest->begin_step(step);
    const double rest_check = ms_since(t5);
    const auto t7 = Clock::now();
    if (r.rollback || r.buddy_every > 0) {
      copy_state({model.params(), static_cast<size_t>(model.num_params())}, snap_params);
      copy_state(adamw.m(), snap_m);
      copy_state(adamw.v(), snap_v);
    }
    const double snapshot = ms_since(t7);
    batch.next();
    if (tokens_file) {
      tokens_file->write(inputs.data(), inputs.size() * sizeof(int32_t));
      tokens_file->write(batch.targets().data(), batch.targets().size() * sizeof(int32_t));
    }
    const int64_t faults0 = minor_page_faults();
    const double abft0 = abft ? abft->stats().seconds : 0;
    const int64_t checks0 = abft ? abft->stats().checks : 0;
    const double witness0 = witness_s;
    const double reference0 = reference ? reference->stats().seconds : 0;
    if (r.buddy_every > 0) witness.start();
    if (reference) reference->begin_step(step);
    const double fp8_check0 = fp8_sentinel ? fp8_sentinel->seconds() : 0;
    if (fp8_sentinel) fp8_sentinel->begin_step(step);
    const auto lr = static_cast<float>(schedule.at(step));
    const StepTimes times = timed_step(model, adamw, tc, batch, lr, step, self);
    const double fp8_check = fp8_sentinel ? 1e3 * (fp8_sentinel->seconds() - fp8_check0) : 0;
    const double fb = times.forward_backward_ms - fp8_check;
    if (r.buddy_every > 0) r.witness_tensors = static_cast<int64_t>(witness.stop().size());
    if (reference) reference->after_reduce(step, 0);
    const double reference_step = reference ? 1e3 * (reference->stats().seconds - reference0) : 0;
    const double abft_step = abft ? 1e3 * (abft->stats().seconds - abft0) : 0;
    if (abft) r.abft_checks_per_step = abft->stats().checks - checks0;
    const double op = times.optimizer_ms;
    const int64_t step_faults = minor_page_faults() - faults0;
    r.last_loss = times.loss;
    r.losses.push_back(r.last_loss);
    r.lrs.push_back(lr);

    // The forward-only pass, outside the step: same batch, updated parameters.
    const auto t2 = Clock::now();
    ChunkCombiner eval_sum;
    for (int64_t mb = 0; mb < B / MB; ++mb) {
      model.eval_loss(inputs.data() + mb * MB * T, batch.targets().data() + mb * MB * T, MB, eval_sum);
    }
    const double fw = ms_since(t2);

    // Verification, outside the step: what [verify] replicas computes on each rank, and the
    // numeric monitors on the step's loss and gradient norm.
    // The replica check takes the parameters' hash from the state-at-rest check where that runs
    // (verify/detect/replicas.hpp).
    const auto t3 = Clock::now();
    if (!at_rest) detect::block_hash(model.params(), static_cast<size_t>(model.num_params()) * sizeof(float));
    const double hs = ms_since(t3);
    r.params_xxh64 = xxh64(model.params(), static_cast<size_t>(model.num_params()) * sizeof(float));
    StepRecord record;
    record.step = step;
    record.loss = r.last_loss;
    record.grad_norm = times.grad_norm;
    const auto t4 = Clock::now();
    for (StepObserver* o : monitors) o->end_step(record);
    const double ms = ms_since(t4);
    const auto t8 = Clock::now();
    if (fp8_sentinel) fp8_sentinel->end_step(record);
    const double fp8_judge = ms_since(t8);
    const auto t6 = Clock::now();
    if (at_rest) at_rest->after_update(step);
    const double rest_hash = ms_since(t6);
    if (step < opt.warmup) continue;
    r.step_page_faults += step_faults;
    step_ms.push_back(fb + op);
    fb_ms.push_back(fb);
    optim_ms.push_back(op);
    fwd_ms.push_back(fw);
    hash_ms.push_back(hs);
    monitor_ms.push_back(ms);
    // This step's check (before it) and hash (after it): what the detector adds per step.
    rest_ms.push_back(rest_check + rest_hash);
    abft_ms.push_back(abft_step);
    snapshot_ms.push_back(snapshot);
    witness_ms.push_back(1e3 * (witness_s - witness0));
    reference_ms.push_back(reference_step);
    fp8_check_ms.push_back(fp8_check);
    fp8_statistics_ms.push_back(fp8_judge);
  }

  if (tokens_file) tokens_file->commit();
  if (r.peak_measured) {
    r.measured = higher_peak(r.measured, backend.measure_gemm_peak());
    r.peak_gflops = r.measured.gflops_for(operands);
  }
  r.step_ms = stats_of(step_ms);
  r.forward_ms = stats_of(fwd_ms);
  r.forward_backward_ms = stats_of(fb_ms);
  r.optimizer_ms = stats_of(optim_ms);
  r.replica_hash_ms = stats_of(hash_ms);
  r.numeric_monitors_ms = stats_of(monitor_ms);
  r.state_at_rest_ms = stats_of(rest_ms);
  r.abft_ms = stats_of(abft_ms);
  r.snapshot_ms = stats_of(snapshot_ms);
  r.witness_ms = stats_of(witness_ms);
  r.reference_ms = stats_of(reference_ms);
  r.fp8_check_ms = stats_of(fp8_check_ms);
  r.fp8_statistics_ms = stats_of(fp8_statistics_ms);
  if (reference) r.reference_tightness = reference->stats().max_ratio;
  if (abft) {
    r.abft_tightness = abft->stats().max_clean_ratio;
    r.abft_faults = abft->stats().faults;
  }
  r.backward_ms = r.forward_backward_ms.median - r.forward_ms.median;
  r.tokens_per_s = static_cast<double>(B * T) / (r.step_ms.median / 1e3);
  r.achieved_gflops = r.tokens_per_s * r.flops_per_token / 1e9;
  r.mfu = r.achieved_gflops / r.peak_gflops;
  r.peak_memory_mib = peak_memory_mib();

  print_stats(out, "step", r.step_ms);
  print_stats(out, "forward_backward", r.forward_backward_ms);
  print_stats(out, "forward (alone)", r.forward_ms);
  print_stats(out, "optimizer", r.optimizer_ms);
  print_stats(out, "replica hash", r.replica_hash_ms);
  print_stats(out, "numeric monitors", r.numeric_monitors_ms);
  print_stats(out, "state at rest", r.state_at_rest_ms);
  if (r.abft) print_stats(out, "abft (in the step)", r.abft_ms);
  if (r.rollback || r.buddy_every > 0) print_stats(out, "state snapshot", r.snapshot_ms);
  if (r.buddy_every > 0) print_stats(out, "buddy witness (in the step)", r.witness_ms);
  if (reference) print_stats(out, "reference check (in the step)", r.reference_ms);
  out << "phases (median ms): forward " << std::setprecision(2) << r.forward_ms.median << ", backward "
      << r.backward_ms << " (forward_backward - forward), optimizer " << r.optimizer_ms.median
      << ", communication 0 (one process), verification " << r.verification_ms() << "\n"
      << "verification at default intervals, outside the step: replica check ([verify] replicas, every step "
         "under dp or tp) hashes the parameters (taken from the state-at-rest hash while that check is on) in "
      << r.replica_hash_ms.median << " ms = " << std::setprecision(2)
      << 100.0 * r.replica_hash_ms.median / r.step_ms.median
      << "% of the step (plus an all-gather of 96 bytes per rank, not timed on one process); numeric monitors "
         "(non-finite, spikes) "
      << std::setprecision(4) << r.numeric_monitors_ms.median << " ms = " << std::setprecision(4)
      << 100.0 * r.numeric_monitors_ms.median / r.step_ms.median << "% of the step; state at rest ([verify] "
         "state_at_rest: parameters and moments hashed after the update and before the next step) "
      << std::setprecision(2) << r.state_at_rest_ms.median << " ms = " << std::setprecision(2)
      << 100.0 * r.state_at_rest_ms.median / r.step_ms.median << "% of the step; slow-rank check ([verify] "
         "stragglers, under several ranks): a subtraction a step and an all-gather of 8 bytes per rank every "
      << cfg.verify.straggler_window << " steps, not timed on one process\n";
  if (r.abft) {
    out << "abft ([verify] abft, inside the step): " << r.abft_checks_per_step << " products checked per step in "
        << std::setprecision(2) << r.abft_ms.median << " ms = " << 100.0 * r.abft_fraction()
        << "% of the step without them; the largest passing |checksum - predicted| was " << std::scientific
        << std::setprecision(2) << r.abft_tightness << std::fixed << " of its threshold; " << r.abft_faults
        << " failed (a failure here is a false alarm or a real fault of this machine)\n";
  }
  if (r.rollback) {
    out << "rollback ([verify] on_fault = \"rollback\"): the step's snapshot of the parameters and moments takes "
        << std::setprecision(2) << r.snapshot_ms.median << " ms = " << 100.0 * r.snapshot_ms.median / r.step_ms.median
        << "% of the step\n";
  }
  if (r.buddy_every > 0) {
    out << "buddy replay ([verify] buddy_every = " << r.buddy_every << "): every " << r.buddy_every
        << " steps one more step (" << std::setprecision(2) << r.step_ms.median - r.witness_ms.median
        << " ms), the witness of both runs (2 x " << r.witness_ms.median << " ms: " << r.witness_tensors
        << " tensors hashed) and a copy of the state (" << r.snapshot_ms.median << " ms) = "
        << 100.0 * r.buddy_fraction()
        << "% of the step; under dp, plus the gather of the witnesses (not timed on one process)\n";
  }
  if (reference) {
    out << "reference checks ([verify] reference_every = " << r.reference_every << "): one op re-checked in "
        << std::setprecision(2) << r.reference_ms.median << " ms (the ops in turn) = " << 100.0 * r.reference_fraction()
        << "% of the step at that interval; the largest passing |trainer - reference| was " << std::scientific
        << r.reference_tightness << std::fixed << " of its bound\n";
  }
  if (r.fp8) {
    out << "fp8 sentinel: statistics judged every step in " << std::setprecision(3) << r.fp8_statistics_ms.median
        << " ms, the shadow check of every fp8 GEMM in " << std::setprecision(2) << r.fp8_check_ms.median
        << " ms; at [verify] fp8_sentinel_every = " << r.fp8_sentinel_every << ", "
        << 100.0 * r.fp8_sentinel_fraction() << "% of the step\n";
  }
  out << "throughput: " << std::setprecision(0) << r.tokens_per_s << " tokens/s, " << std::setprecision(1)
      << r.achieved_gflops << " GFLOP/s achieved, MFU " << std::setprecision(3) << r.mfu << " of "
      << std::setprecision(1) << r.peak_gflops << " GFLOP/s"
      << (r.peak_measured ? " (" + r.measured.source_for(operands) + ", the higher of the two measurements)"
                          : std::string())
      << "; peak memory "
      << std::setprecision(0) << r.peak_memory_mib << " MiB; last loss " << std::setprecision(4) << r.last_loss << "\n"
      << "steady state: " << r.step_page_faults << " minor page faults in the " << opt.steps
      << " timed steps (0: no step touches memory for the first time)\n";
  return r;
}

}  // namespace lockstep
