#include "src/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <thread>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/sgemm_threads.hpp"
#include "src/ckpt/checkpoint.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/mesh.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/parallel/tp_plan.hpp"
#include "src/train/cpu_setup.hpp"
#include "src/train/inject.hpp"
#include "src/train/metrics.hpp"
#include "verify/dump.hpp"

namespace lockstep {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Parameters and (if m and v are given) optimizer state as checkpoint tensors, in canonical order:
// whole (global) tensors laid out as `layout` (the tp = 1 layout).
std::vector<ckpt::TensorRef> state_tensors(const std::vector<ParamTensor>& layout, const float* params,
                                           const float* m, const float* v) {
  std::vector<ckpt::TensorRef> refs;
  for (const auto& p : layout) {
    refs.push_back({ckpt::kModelPrefix + p.name, DType::kF32, p.shape, params + p.offset});
  }
  if (m != nullptr) {
    for (const auto& p : layout) {
      refs.push_back({"optim/m/" + p.name, DType::kF32, p.shape, m + p.offset});
      refs.push_back({"optim/v/" + p.name, DType::kF32, p.shape, v + p.offset});
    }
  }
  return refs;
}

// --parallel.check_replicas: every member of `group` must hold the same hash `mine` of what it
// replicates (`what`: a dp replica's parameters; under tp, the tensors every tp rank holds whole).
// The reference is the most common hash (rank 0's on a tie); rank 0 ends the job naming every rank
// that differs.
void check_replicas(uint64_t mine, comm::Communicator& group, int64_t step, const char* what) {
  const std::vector<uint64_t> all = group.all_gather(mine);
  uint64_t ref = all[0];
  int64_t best = 0;
  for (uint64_t h : all) {
    const auto n = std::count(all.begin(), all.end(), h);
    if (n > best) best = n, ref = h;
  }
  std::string odd;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] != ref) {
      odd += str_cat(odd.empty() ? "" : "; ", group.name(), " rank ", r, " (world rank ", group.world_ranks()[r],
                     ") has ", what, " hash ", hex64(all[r]));
    }
  }
  if (odd.empty()) return;
  if (group.rank() == 0) {
    comm::abort_job(str_cat("replica check after step ", step, ": ", odd, ", the others ", hex64(ref), " (the ",
                            group.name(), " group's ranks must agree bitwise)"),
                    comm::kExitDiverged);
  }
  group.barrier();  // rank 0 of the group is ending the job
}

// Hash of the tensors this rank holds whole although tensor parallelism splits the model (norms,
// row-parallel biases, wpe): every tp rank computes them from the same inputs.
uint64_t tp_replicated_hash(const Model& model) {
  uint64_t h = 0;
  for (const auto& p : model.param_layout()) {
    if (p.replicated()) h = xxh64(model.params() + p.offset, static_cast<size_t>(p.numel) * sizeof(float), h);
  }
  return h;
}

// --parallel.debug_fault: test-only faults, injected after step debug_step on rank debug_rank.
void inject_fault(const ParallelConfig& p, int world_rank, int64_t step, Model& model) {
  if (p.debug_fault == "none" || world_rank != p.debug_rank || step != p.debug_step) return;
  std::fprintf(stderr, "rank %d: --parallel.debug_fault=%s after step %lld\n", world_rank, p.debug_fault.c_str(),
               static_cast<long long>(step));
  std::fflush(stderr);
  if (p.debug_fault == "exit") _exit(9);
  if (p.debug_fault == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // "flip": the lowest mantissa bit of the final norm's first weight, which every tp rank holds
  // whole, so that both the dp and the tp replica checks can see it.
  float* w = model.params() + model.param("lnf/weight").offset;
  uint32_t bits;
  std::memcpy(&bits, w, sizeof bits);
  bits ^= 1u;
  std::memcpy(w, &bits, sizeof bits);
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

// The loop on one rank of a (possibly single-rank) world.
TrainSummary train_on(const RunConfig& cfg, comm::Communicator& world, std::ostream& console) {
  std::ostream null_stream(nullptr);  // ranks other than 0 print nothing
  std::ostream& out = world.rank() == 0 ? console : null_stream;
  const TrainConfig& tc = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  const int64_t threads = apply_cpu_settings(tc);

  parallel::Mesh mesh({pc.dp, pc.tp, pc.pp, pc.ep, pc.cp}, world, cfg.source);
  comm::Communicator& dpc = mesh.dp();
  comm::Communicator& tpc = mesh.group(parallel::Axis::kTp);
  const int64_t tp = tpc.size();
  const int64_t dp = dpc.size(), dp_rank = dpc.rank();
  const int64_t T = cfg.model.seq_len, B = tc.batch_size, MB = tc.micro_batch();
  const parallel::DpBatch part = parallel::plan_dp_batch(B, MB, T, dp, tc.mode, cfg.source);
  const int64_t BL = part.local_batch, MBL = part.local_micro;
  parallel::check_tp_layout(cfg.model, tp, pc.sp, MBL * T, tc.mode, cfg.source);

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

  // Tensor parallelism: the model holds this rank's shards and reduces over the tp group.
  std::optional<parallel::CommTpGroup> tp_group;
  std::optional<parallel::TensorParallelPlan> tp_plan;
  if (tp > 1) {
    tp_group.emplace(tpc);
    tp_plan.emplace(*tp_group, pc.sp);
  }
  Model model(cfg.model, tc.mode, MBL, {.plan = tp_plan ? &*tp_plan : nullptr});
  const bool sp = tp > 1 && pc.sp;
  const auto reduce = pc.reduce == "exact" ? parallel::ReduceMode::kExact : parallel::ReduceMode::kFast;
  // world = dp × tp while pp, ep and cp are 1 (the mesh refuses more).
  parallel::DataParallel ddp(model, dpc, tpc, world, static_cast<int>(pc.zero), reduce,
                             {static_cast<float>(tc.beta1), static_cast<float>(tc.beta2),
                              static_cast<float>(tc.eps), static_cast<float>(tc.weight_decay)},
                             parallel::DpOptions{static_cast<int64_t>(pc.bucket_mb * (1 << 20)), pc.overlap, sp});
  const LrSchedule schedule{tc.lr, tc.min_lr, tc.warmup, tc.steps};

  // [dump] and [inject]: the model gets a hook only while one of them is on, so that both cost
  // nothing when off. The injection acts first, so a dump records the tensor as the model uses it.
  std::optional<verify::DumpWriter> dump;
  if (!cfg.dump.dir.empty()) {
    // Batch tensors are gathered over tp (the hooks see shards) and then over dp to the rank that
    // is rank 0 of both, so a dump compares directly with a single process's.
    dump.emplace(cfg.dump.dir, cfg.dump.tensors, cfg.dump.steps, cfg.to_json(),
                 nlohmann::json{{"dp", dp}, {"tp", pc.tp}, {"sp", pc.sp}, {"zero", pc.zero}, {"pp", pc.pp},
                                {"ep", pc.ep}, {"cp", pc.cp}, {"mode", mode_name(tc.mode)}, {"micro_batch", MBL}},
                 &dpc, verify::DumpTp{tp > 1 ? &tpc : nullptr, &model.desc(), pc.sp});
  }
  Injector injector(parse_injection(cfg.inject, cfg.source, cfg.model), world.rank());
  LS_REQUIRE(cfg.inject.rank < world.size(), cfg.source, ": [inject] rank (", cfg.inject.rank,
             ") is not a rank of this run (", world.size(), " ranks)");
  if (dump || injector.active()) {
    model.set_hook([&](std::string_view name, float* data, std::span<const int64_t> shape) {
      injector.on_tensor(name, data, shape);
      if (dump) dump->observe(name, data, shape);
    });
  }

  // Checkpoints and the model hash hold whole tensors: the tp = 1 layout, gathered from the shards.
  const std::vector<ParamTensor> global_layout = build_param_layout(cfg.model);
  const int64_t global_params = global_layout.back().offset + global_layout.back().numel;
  auto gather = [&](const float* local) {
    return tp > 1 ? parallel::gather_global(cfg.model, model.param_layout(), local, tpc)
                  : std::vector<float>(local, local + model.num_params());
  };
  // Dumps the whole tensors of `local` (this rank's flat buffer) as prefix + name, if `step` dumps
  // any of them: ZeRO-2's gradient shards (dp_sharded: `local` is this rank's shard) are gathered
  // over dp first, then the tp shards over tp. Collective; the decision is the same on every rank.
  auto dump_params = [&](int64_t step, const std::string& prefix, const float* local, bool dp_sharded) {
    std::vector<std::string> names;
    for (const auto& p : global_layout) names.push_back(prefix + p.name);
    if (!dump->wants_any(step, names)) return;
    std::vector<float> replica;
    if (dp_sharded) {
      replica.resize(static_cast<size_t>(model.num_params()));
      ddp.gather_shards(local, replica.data());
      local = replica.data();
    }
    const std::vector<float> global = gather(local);
    for (size_t i = 0; i < global_layout.size(); ++i) {
      dump->add(names[i], global.data() + global_layout[i].offset, global_layout[i].shape);
    }
  };

  TrainSummary summary;
  if (!cfg.checkpoint.dir.empty()) {
    std::ostringstream warnings;
    auto ck = ckpt::load_latest(cfg.checkpoint.dir, warnings);
    if (!warnings.str().empty()) out << "warning: " << warnings.str() << std::flush;
    if (ck) {
      check_resumable(*ck, cfg);
      // Checkpoints hold whole tensors; every rank reads them and keeps its tp shards and its part
      // of m and v.
      std::vector<float> w(static_cast<size_t>(global_params)), m(w.size()), v(w.size());
      for (const auto& p : global_layout) {
        ck->copy_to(ckpt::kModelPrefix + p.name, DType::kF32, p.shape, w.data() + p.offset);
        ck->copy_to("optim/m/" + p.name, DType::kF32, p.shape, m.data() + p.offset);
        ck->copy_to("optim/v/" + p.name, DType::kF32, p.shape, v.data() + p.offset);
      }
      std::vector<float> m_local(static_cast<size_t>(model.num_params())), v_local(m_local.size());
      parallel::take_local(cfg.model, model.param_layout(), w.data(), model.params());
      parallel::take_local(cfg.model, model.param_layout(), m.data(), m_local.data());
      parallel::take_local(cfg.model, model.param_layout(), v.data(), v_local.data());
      ddp.load_optimizer_state(m_local.data(), v_local.data());
      sampler.restore(ck->state.at("sampler").get<data::SamplerState>());
      summary.first_step = ck->state.at("step").get<int64_t>();
      out << "resumed from " << ck->dir << " (step " << summary.first_step << ")\n";
    }
  }
  if (summary.first_step == 0) model.init_parameters();
  LS_REQUIRE(tc.stop_after < 0 || tc.stop_after >= summary.first_step, cfg.source, ": [train] stop_after (",
             tc.stop_after, ") is a step before the one this run resumes from (", summary.first_step, ", ",
             cfg.checkpoint.dir, ")");

  const GemmPeak measured = tc.peak_gflops > 0 ? GemmPeak{} : measure_gemm_peak();
  const double peak = tc.peak_gflops > 0 ? tc.peak_gflops : measured.gflops;
  const double flops_per_token = model.flops_per_token();
  out << "model: " << global_params << " parameters, " << std::fixed << std::setprecision(2)
      << flops_per_token / 1e6 << " MFLOP/token; mode " << mode_name(tc.mode) << ", " << threads
      << " threads, " << cpu::isa_name(cpu::active_isa())
      << (tc.mode == Mode::kFast ? " (fast mode's GEMM " + cpu::fast_gemm_name() + ")" : std::string())
      << "; batch " << B << " x " << T << " tokens (micro-batch " << MB << "); MFU against "
      << std::setprecision(1) << peak << " GFLOP/s fp32 GEMM peak per rank"
      << (tc.peak_gflops > 0 ? " (configured)" : " (measured: " + measured.describe() + ")") << "\n";
  // The least a rank must send per step: to sum its N fp32 gradients over dp (a ring all-reduce,
  // or ZeRO's reduce-scatter + parameter all-gather) 2 · 4N · (dp-1)/dp bytes, plus tensor
  // parallelism's activation all-reduces (tensor_parallel.hpp).
  const uint64_t dp_min_bytes = static_cast<uint64_t>(model.num_params()) * 8 * static_cast<uint64_t>(dp - 1) /
                                static_cast<uint64_t>(dp);
  const uint64_t tp_min_bytes = parallel::tp_min_bytes(cfg.model, tp, pc.sp, BL * T);
  const uint64_t min_bytes = dp_min_bytes + tp_min_bytes;
  // The model's own gradient buffers: fp32, and in canonical mode the exact sums (a double and a
  // spill flag per element).
  const uint64_t full_grad_bytes =
      static_cast<uint64_t>(model.num_params()) *
      (tc.mode == Mode::kCanonical ? sizeof(float) + sizeof(double) + 1 : sizeof(float));
  if (world.size() > 1) {
    out << "parallel: " << mesh.describe() << (pc.sp ? ", sequence parallel" : "") << ", zero " << pc.zero
        << ", reduce " << pc.reduce << "; rank batch " << BL << " (micro-batch " << MBL << "); " << model.num_params() << " parameters per rank; optimizer state "
        << ddp.optimizer_state_bytes() << " bytes per rank (replicated: " << 8 * model.num_params()
        << "); minimum sent per rank per step " << min_bytes << " bytes (gradient sync " << dp_min_bytes
        << ", tensor parallel " << tp_min_bytes << ")\n";
    // Buckets as large as the model leave zero 2 nothing to save: say so rather than let a user
    // believe the gradient is sharded in memory.
    const uint64_t staging = ddp.staging_budget_bytes();
    if (staging > 0 && staging >= full_grad_bytes) {
      out << "warning: ZeRO-2 stages up to " << staging << " gradient bytes per rank, as much as a full gradient: "
          << "[parallel] bucket_mb (" << std::setprecision(4) << pc.bucket_mb << ") is too large for this model to save gradient memory\n";
    }
  }

  MetricsWriter metrics;
  if (world.rank() == 0 && !cfg.log.metrics.empty()) metrics = MetricsWriter(cfg.log.metrics, summary.first_step > 0);

  g_stop_signal.store(0);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);

  std::vector<int32_t> inputs(BL * T), targets(BL * T);
  const float dloss = 1.0f / static_cast<float>(B * T);
  double total_time = 0;
  int64_t steps_this_run = 0;

  // The first dp replica evaluates (replicas are equal; its tp ranks together); the same windows as
  // one process, MBL at a time.
  auto evaluate = [&]() -> float {
    ChunkCombiner loss_sum;
    for (int64_t s = 0; s < cfg.eval.batches * MB; s += MBL) {
      val_reader->fill(s, MBL, inputs.data(), targets.data());
      model.eval_loss(inputs.data(), targets.data(), MBL, loss_sum);
    }
    return loss_sum.finish() / static_cast<float>(cfg.eval.batches * MB * T);
  };
  // Collective: ZeRO-1/2 gather m and v over dp, tensor parallelism gathers the shards over tp;
  // rank 0 writes whole tensors. The state records the layout that trained them and where each
  // tp shard lies in its global tensor.
  auto save = [&](int64_t step_done, float loss) {
    if (cfg.checkpoint.dir.empty()) return;
    std::vector<float> m, v;
    ddp.gather_optimizer_state(m, v);
    const std::vector<float> w = gather(model.params()), mg = gather(m.data()), vg = gather(v.data());
    if (world.rank() != 0) return;
    nlohmann::json layout = {{"dp", dp}, {"tp", tp}, {"sp", pc.sp}, {"zero", pc.zero}, {"reduce", pc.reduce}};
    if (tp > 1) layout["tp_shards"] = parallel::describe_shards(cfg.model, tp);
    nlohmann::json state = {{"step", step_done},
                            {"sampler", sampler.state()},
                            {"config", cfg.to_json()},
                            {"layout", layout},
                            {"loss", loss}};
    const auto dir = ckpt::save(cfg.checkpoint.dir, step_done,
                                state_tensors(global_layout, w.data(), mg.data(), vg.data()), state,
                                static_cast<int>(cfg.checkpoint.keep));
    out << "checkpoint " << dir << "\n";
  };

  int64_t step = summary.first_step;
  for (; step < tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t bytes_before = dpc.stats().total() + (tp > 1 ? tpc.stats().total() : 0);
    const float lr = static_cast<float>(schedule.at(step));
    sampler.next_batch(B, dp_rank * BL, BL, inputs.data(), targets.data());
    model.zero_grad();
    if (dump) dump->begin_step(step);
    injector.begin_step(model, step);
    ChunkCombiner loss_sum;
    model.forward_backward_batch(inputs.data(), targets.data(), BL, MBL, dp_rank * BL * T, dloss,
                                 loss_sum);
    injector.end_step(model);
    if (sp) ddp.sum_norm_grads_over_tp();
    ddp.reduce_gradients();
    const parallel::OverlapStats overlap = ddp.overlap_stats();
    const float loss = ddp.reduce_loss(loss_sum) / static_cast<float>(B * T);
    if (dump) {
      dump->add("loss", &loss, {});
      // Reduced, before clipping.
      dump_params(step, "grad/param/", ddp.grads_sharded() ? ddp.grad_shard() : model.grads(), ddp.grads_sharded());
    }
    const float grad_norm = ddp.clip_grad_norm(static_cast<float>(tc.grad_clip));
    ddp.step(lr, step + 1);
    if (dump) {
      dump_params(step, "param/", model.params(), false);
      dump->end_step();
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t step_bytes = dpc.stats().total() + (tp > 1 ? tpc.stats().total() : 0) - bytes_before;
    total_time += dt;
    ++steps_this_run;
    summary.last_loss = loss;
    const int64_t done = step + 1;
    inject_fault(pc, world.rank(), done, model);
    if (pc.check_replicas && dp > 1) {
      check_replicas(xxh64(model.params(), static_cast<size_t>(model.num_params()) * sizeof(float)), dpc, done,
                     "parameter");
    }
    if (pc.check_replicas && tp > 1) check_replicas(tp_replicated_hash(model), tpc, done, "replicated-tensor");
    if (world.size() > 1 && steps_this_run == 1) {
      out << "parallel: step " << done << " sent " << step_bytes << " bytes from rank 0 (" << std::setprecision(2)
          << (min_bytes > 0 ? static_cast<double>(step_bytes) / static_cast<double>(min_bytes) : 0.0)
          << " x the minimum)";
      if (overlap.buckets > 0) {
        out << "; " << overlap.buckets << " gradient buckets, " << std::setprecision(0) << 100 * overlap.hidden_share()
            << "% of their communication hidden behind the backward";
      }
      // After a step: ZeRO-2's staging pool fills as the backward needs it.
      out << "; gradient storage " << ddp.grad_bytes() << " bytes per rank (full buffers: " << full_grad_bytes
          << ")\n";
    }

    const double tokens_per_s = static_cast<double>(B * T) / dt;
    // The peak is one rank's (measured with its own threads); the job's is world.size() of them.
    const double mfu = tokens_per_s * flops_per_token / (peak * 1e9 * static_cast<double>(world.size()));
    const double mem = peak_memory_mib();
    // [train] stop_after: this step ends the run as the last one would (evaluation, checkpoint).
    const bool last = done == tc.steps || step == tc.stop_after;
    if (done % cfg.log.every == 0 || last) {
      out << "step " << std::setw(6) << done << "/" << tc.steps << " | loss " << std::setprecision(4)
          << loss << " | lr " << std::scientific << std::setprecision(3) << lr << std::fixed
          << " | grad norm " << std::setprecision(3) << grad_norm << " | " << std::setprecision(0)
          << tokens_per_s << " tok/s | MFU " << std::setprecision(1) << 100 * mfu << "% | "
          << std::setprecision(0) << mem << " MiB\n"
          << std::flush;
    }
    nlohmann::json record = {{"step", done}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                             {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"step_ms", dt * 1e3},
                             {"peak_mem_mib", mem}};
    if (world.size() > 1) {
      record["comm_bytes"] = step_bytes;
      record["optimizer_state_bytes"] = ddp.optimizer_state_bytes();
      record["grad_bytes"] = ddp.grad_bytes();
      record["grad_buckets"] = overlap.buckets;
      record["grad_comm_ms"] = 1e3 * overlap.comm_s;
      record["grad_exposed_ms"] = 1e3 * overlap.exposed_s;
      record["grad_hidden"] = overlap.hidden_share();
    }
    metrics.write(record);

    if (val_reader && ((cfg.eval.every > 0 && done % cfg.eval.every == 0) || last) && dp_rank == 0) {
      summary.val_loss = evaluate();
      out << "eval step " << done << " | val loss " << std::setprecision(4) << summary.val_loss << "\n";
      metrics.write({{"step", done}, {"val_loss", summary.val_loss}});
    }
    // Every rank stops after the same step: a signal seen by any rank stops all of them.
    int64_t stop_signal = g_stop_signal.load();
    if (world.size() > 1) world.all_reduce(std::span<int64_t>(&stop_signal, 1), comm::ReduceOp::kMax);
    const bool stopping = stop_signal != 0;
    if (last || stopping || (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0)) {
      save(done, loss);
    }
    if (step == tc.stop_after && !stopping && done < tc.steps) {
      out << "stopped early: " << done << " of " << tc.steps << " steps done ([train] stop_after = " << tc.stop_after
          << "; the same command without it continues the run)\n";
      ++step;
      break;
    }
    if (stopping) {
      out << "stopped by signal " << stop_signal << " after step " << done
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
  const std::vector<float> final_params = gather(model.params());
  summary.model_hash = hex64(ckpt::model_hash(state_tensors(global_layout, final_params.data(), nullptr, nullptr)));
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

}  // namespace

TrainSummary train(const RunConfig& cfg, std::ostream& out) {
  // Under mpirun/srun: MPI's world (finalised when `mpi` goes, after `world`). Otherwise a group of
  // one and MPI is never initialised.
  std::unique_ptr<comm::MpiRuntime> mpi;
  std::unique_ptr<comm::Communicator> world;
  if (comm::MpiRuntime::launched()) {
    mpi = std::make_unique<comm::MpiRuntime>();
    world = mpi->world(cfg.parallel.timeout_s);
  } else {
    world = std::make_unique<comm::SelfCommunicator>("world");
  }
  return train_on(cfg, *world, out);
}

}  // namespace lockstep
