#include "src/train/trainer.hpp"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>
#include <thread>

#include "kernels/cpu/isa.hpp"
#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "src/model/gpt.hpp"
#include "src/optim/adamw.hpp"
#include "src/train/metrics.hpp"

namespace lockstep {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Parameters and optimizer state as checkpoint tensors, in the model's canonical order.
std::vector<ckpt::TensorRef> state_tensors(const Gpt& model, const AdamW& opt, bool with_optimizer) {
  std::vector<ckpt::TensorRef> refs;
  for (const auto& p : model.param_layout()) {
    refs.push_back({ckpt::kModelPrefix + p.name, DType::kF32, p.shape, model.params() + p.offset});
  }
  if (with_optimizer) {
    for (const auto& p : model.param_layout()) {
      refs.push_back({"optim/m/" + p.name, DType::kF32, p.shape, opt.m().data() + p.offset});
      refs.push_back({"optim/v/" + p.name, DType::kF32, p.shape, opt.v().data() + p.offset});
    }
  }
  return refs;
}

// A checkpoint can continue this run only if everything that shapes the trajectory matches.
void check_resumable(const ckpt::Checkpoint& ck, const RunConfig& cfg) {
  const nlohmann::json now = cfg.to_json();
  const nlohmann::json& then = ck.state.at("config");
  for (const char* section : {"model"}) {
    for (const auto& [key, value] : now[section].items()) {
      LS_REQUIRE(then[section].contains(key) && then[section][key] == value, ck.dir,
                 ": cannot resume: it was written with [", section, "] ", key, " = ",
                 then[section].value(key, nlohmann::json()).dump(), ", this run has ", value.dump(),
                 " (use another [checkpoint] dir, or the same config)");
    }
  }
  for (const char* key : {"batch_size", "mode", "seed"}) {
    LS_REQUIRE(then["train"][key] == now["train"][key], ck.dir, ": cannot resume: it was written with [train] ",
               key, " = ", then["train"][key].dump(), ", this run has ", now["train"][key].dump());
  }
}

std::optional<double> source_entropy(const std::string& train_path) {
  const auto path = std::filesystem::path(train_path).parent_path() / "source.json";
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.contains("entropy_rate_nats")) return j["entropy_rate_nats"].get<double>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

}  // namespace

TrainSummary train(const RunConfig& cfg, std::ostream& out) {
  const TrainConfig& tc = cfg.train;
  const int threads = tc.threads > 0 ? static_cast<int>(tc.threads)
                                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  if (tc.isa != "auto") cpu::set_isa(tc.isa == "avx2" ? cpu::Isa::kAvx2 : cpu::Isa::kAvx512);

  const int64_t T = cfg.model.seq_len, B = tc.batch_size, MB = tc.micro_batch();
  data::TokenFile train_file(cfg.data.train);
  train_file.check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
  std::optional<data::TokenFile> val_file;
  if (!cfg.data.val.empty()) {
    val_file.emplace(cfg.data.val);
    val_file->check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
  }
  data::TrainSampler sampler(train_file, T, tc.seed);
  std::optional<data::EvalReader> val_reader;
  if (val_file) val_reader.emplace(*val_file, T);

  Gpt model(cfg.model, tc.mode, MB);
  AdamW opt(model, {static_cast<float>(tc.beta1), static_cast<float>(tc.beta2),
                    static_cast<float>(tc.eps), static_cast<float>(tc.weight_decay)});
  const LrSchedule schedule{tc.lr, tc.min_lr, tc.warmup, tc.steps};

  TrainSummary summary;
  if (!cfg.checkpoint.dir.empty()) {
    std::ostringstream warnings;
    auto ck = ckpt::load_latest(cfg.checkpoint.dir, warnings);
    if (!warnings.str().empty()) out << "warning: " << warnings.str() << std::flush;
    if (ck) {
      check_resumable(*ck, cfg);
      for (const auto& p : model.param_layout()) {
        ck->copy_to(ckpt::kModelPrefix + p.name, DType::kF32, p.shape, model.params() + p.offset);
        ck->copy_to("optim/m/" + p.name, DType::kF32, p.shape, opt.m().data() + p.offset);
        ck->copy_to("optim/v/" + p.name, DType::kF32, p.shape, opt.v().data() + p.offset);
      }
      sampler.restore(ck->state.at("sampler").get<data::SamplerState>());
      summary.first_step = ck->state.at("step").get<int64_t>();
      out << "resumed from " << ck->dir << " (step " << summary.first_step << ")\n";
    }
  }
  if (summary.first_step == 0) model.init_parameters();

  const double peak = tc.peak_gflops > 0 ? tc.peak_gflops : measure_sgemm_peak_gflops();
  const double flops_per_token = model.flops_per_token();
  out << "model: " << model.num_params() << " parameters, " << std::fixed << std::setprecision(2)
      << flops_per_token / 1e6 << " MFLOP/token; mode " << mode_name(tc.mode) << ", " << threads
      << " threads, " << cpu::isa_name(cpu::active_isa()) << "; batch " << B << " x " << T << " tokens (micro-batch " << MB << "); MFU against "
      << std::setprecision(1) << peak << " GFLOP/s sgemm peak"
      << (tc.peak_gflops > 0 ? " (configured)" : " (measured)") << "\n";

  MetricsWriter metrics;
  if (!cfg.log.metrics.empty()) metrics = MetricsWriter(cfg.log.metrics, summary.first_step > 0);

  g_stop_signal.store(0);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);

  std::vector<int32_t> inputs(B * T), targets(B * T);
  const float dloss = 1.0f / static_cast<float>(B * T);
  double total_time = 0;
  int64_t steps_this_run = 0;

  auto evaluate = [&]() -> float {
    ChunkCombiner loss_sum;
    for (int64_t b = 0; b < cfg.eval.batches; ++b) {
      val_reader->fill(b * MB, MB, inputs.data(), targets.data());
      model.eval_loss(inputs.data(), targets.data(), MB, loss_sum);
    }
    return loss_sum.finish() / static_cast<float>(cfg.eval.batches * MB * T);
  };
  auto save = [&](int64_t step_done, float loss) {
    if (cfg.checkpoint.dir.empty()) return;
    nlohmann::json state = {{"step", step_done},
                            {"sampler", sampler.state()},
                            {"config", cfg.to_json()},
                            {"loss", loss}};
    const auto dir = ckpt::save(cfg.checkpoint.dir, step_done, state_tensors(model, opt, true), state,
                                static_cast<int>(cfg.checkpoint.keep));
    out << "checkpoint " << dir << "\n";
  };

  int64_t step = summary.first_step;
  for (; step < tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const float lr = static_cast<float>(schedule.at(step));
    sampler.next_batch(B, 0, B, inputs.data(), targets.data());
    model.zero_grad();
    ChunkCombiner loss_sum;
    for (int64_t mb = 0; mb < B / MB; ++mb) {
      model.forward_backward(inputs.data() + mb * MB * T, targets.data() + mb * MB * T, MB,
                             mb * MB * T, dloss, loss_sum);
    }
    model.finish_grads();
    const float loss = loss_sum.finish() / static_cast<float>(B * T);
    const float grad_norm = clip_grad_norm(model, static_cast<float>(tc.grad_clip));
    opt.update(model, lr, step + 1);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_time += dt;
    ++steps_this_run;
    summary.last_loss = loss;

    const double tokens_per_s = static_cast<double>(B * T) / dt;
    const double mfu = tokens_per_s * flops_per_token / (peak * 1e9);
    const double mem = peak_memory_mib();
    const int64_t done = step + 1;
    if (done % cfg.log.every == 0 || done == tc.steps) {
      out << "step " << std::setw(6) << done << "/" << tc.steps << " | loss " << std::setprecision(4)
          << loss << " | lr " << std::scientific << std::setprecision(3) << lr << std::fixed
          << " | grad norm " << std::setprecision(3) << grad_norm << " | " << std::setprecision(0)
          << tokens_per_s << " tok/s | MFU " << std::setprecision(1) << 100 * mfu << "% | "
          << std::setprecision(0) << mem << " MiB\n"
          << std::flush;
    }
    metrics.write({{"step", done}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                   {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"step_ms", dt * 1e3},
                   {"peak_mem_mib", mem}});

    const bool last = done == tc.steps;
    if (val_reader && ((cfg.eval.every > 0 && done % cfg.eval.every == 0) || last)) {
      summary.val_loss = evaluate();
      out << "eval step " << done << " | val loss " << std::setprecision(4) << summary.val_loss << "\n";
      metrics.write({{"step", done}, {"val_loss", summary.val_loss}});
    }
    const bool stopping = g_stop_signal.load() != 0;
    if (last || stopping || (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0)) {
      save(done, loss);
    }
    if (stopping) {
      out << "stopped by signal " << g_stop_signal.load() << " after step " << done
          << " (checkpoint saved; run the same command to resume)\n";
      summary.interrupted = true;
      ++step;
      break;
    }
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);

  summary.steps_done = step;
  summary.tokens_per_s = steps_this_run > 0 ? static_cast<double>(steps_this_run * B * T) / total_time : 0;
  summary.model_hash = hex64(ckpt::model_hash(state_tensors(model, opt, false)));
  out << "done: " << summary.steps_done << " steps";
  if (steps_this_run > 0) {
    out << ", last loss " << std::setprecision(4) << summary.last_loss << ", " << std::setprecision(0)
        << summary.tokens_per_s << " tok/s mean";
  }
  if (summary.val_loss >= 0) {
    out << ", val loss " << std::setprecision(4) << summary.val_loss;
    if (auto h = source_entropy(cfg.data.train)) {
      out << " (source entropy rate " << *h << " nats/token, gap " << summary.val_loss - *h << ")";
    }
  }
  out << "\nmodel hash " << summary.model_hash << "\n";
  return summary;
}

}  // namespace lockstep
