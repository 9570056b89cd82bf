#include "src/train/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <span>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/expert_parallel.hpp"
#include "src/parallel/mesh.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/parallel/tp_plan.hpp"
#include "src/train/buddy_replay.hpp"
#include "src/train/campaign_recorder.hpp"
#include "src/train/checkpointing.hpp"
#include "src/train/detectors.hpp"
#include "src/train/init_from.hpp"
#include "src/train/inject.hpp"
#include "src/train/kernel_cache.hpp"
#include "src/train/fp8_statistics.hpp"
#include "src/train/moe_statistics.hpp"
#include "src/train/metrics.hpp"
#include "src/train/observers.hpp"
#include "src/train/pipeline.hpp"
#include "src/train/replay.hpp"
#include "src/train/rollback.hpp"
#include "src/train/run.hpp"
#include "verify/core/dump.hpp"
#include "verify/detect/abft.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/finding.hpp"
#include "verify/detect/fp8_sentinel.hpp"
#include "verify/detect/nonfinite.hpp"
#include "verify/detect/reference_check.hpp"
#include "verify/detect/replicas.hpp"
#include "verify/detect/spikes.hpp"
#include "verify/detect/state_at_rest.hpp"
#include "verify/detect/stragglers.hpp"
#include "verify/detect/verified_comm.hpp"

namespace lockstep {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// ZeRO-3 leaves no rank the whole parameters between passes, and each layer's gathered ones move
// from window to window: what reads them outside the passes, edits them in place, or knows them
// by their address is refused, one line naming it.
void check_zero3(const RunConfig& cfg, const std::vector<Injection>& faults) {
  if (cfg.parallel.zero != 3) return;
  const auto refuse = [&](bool conflict, const std::string& what, const std::string& why) {
    LS_REQUIRE(!conflict, cfg.source, ": [parallel] zero = 3 does not run with ", what, " (", why,
               "); use zero = 2 for it");
  };
  const std::string layout = parallel::zero3_layout_problem(cfg.parallel.pp, cfg.train.precision);
  LS_REQUIRE(layout.empty(), cfg.source, ": [parallel] zero = 3 does not run with ", layout, "; use zero = 2 for it");
  refuse(cfg.verify.abft, "[verify] abft", "its checksums know the weights by their address");
  refuse(cfg.verify.reference_every > 0, "[verify] reference_every", "the reference reads an op's parameters between passes");
  refuse(cfg.verify.buddy_every > 0, "[verify] buddy_every", "a buddy's replay is not checked under sharded parameters");
  for (const Injection& f : faults) {
    refuse(f.site.starts_with("param/"), "[inject] site " + f.site, "no rank holds the whole parameter to edit");
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

// The parameters of each pipeline stage, whole (tp = 1), in stage order.
std::vector<int64_t> stage_params(const ModelDesc& desc, const std::vector<StageLayers>& stages) {
  std::vector<int64_t> out;
  for (const StageLayers& s : stages) {
    int64_t n = 0;
    for (const ParamTensor& t : build_param_layout(desc, {}, s.first, s.end)) n += t.numel;
    out.push_back(n);
  }
  return out;
}

// Under ZeRO-3, the parameter bytes a rank holds: its shard and the two gather windows.
std::string held_params_note(const TrainRun& run) {
  const parallel::Zero3Params* z = run.ddp.sharded_params();
  if (z == nullptr) return "";
  return str_cat(" (ZeRO-3 holds ", z->bytes(), " bytes: a shard of ", z->shard_end() - z->shard_first(),
                 " and two windows for a layer's gathered parameters, instead of ", 4 * run.model.num_params(), ")");
}

// The start-up lines — the model and its numerics; under a parallel layout what a rank holds and
// the least it must send — and the costs Progress reports against.
Progress::Costs report_setup(const TrainRun& run, const parallel::Mesh& mesh, const CpuBackend& backend) {
  const RunConfig& cfg = run.cfg;
  const TrainConfig& tc = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  std::ostream& out = run.out;
  Progress::Costs costs;
  std::string measured_note;
  const GemmPeak measured = tc.peak_gflops > 0 ? GemmPeak{}
                                               : agreed_gemm_peak(backend, kernel_cache_path(tc.kernel_cache),
                                                                  run.world, &measured_note);
  if (tc.peak_gflops <= 0) backend.choose_gemms(measured);
  // The peak memory a run reports is its training's: not the measurement's products, which only a
  // run that found no cached figures made (what they keep stays resident and counts).
  restart_peak_memory();
  // A run whose linears take bf16 operands is measured against the faster of the bf16 kernels.
  const bool bf16 = tc.precision == Precision::kBf16;
  costs.peak_gflops = tc.peak_gflops > 0 ? tc.peak_gflops : measured.gflops_for(bf16 ? Operands::kBf16 : Operands::kFp32);
  costs.flops_per_token = run.model.flops_per_token();
  const int64_t global_params = run.global_layout.back().offset + run.global_layout.back().numel;
  out << "model: " << global_params << " parameters, " << std::fixed << std::setprecision(2)
      << costs.flops_per_token / 1e6 << " MFLOP/token; mode " << mode_name(tc.mode) << ", " << backend.threads()
      << " threads, " << backend.describe(tc.mode) << "; batch "
      << run.B << " x " << run.T << " tokens (micro-batch " << run.MB << "); MFU against " << std::setprecision(1)
      << costs.peak_gflops << " GFLOP/s " << (bf16 ? "bf16" : "fp32") << " GEMM peak per rank"
      << (tc.peak_gflops > 0 ? " (configured)" : " (measured: " + measured.describe() + ")") << "\n";
  if (tc.peak_gflops <= 0) out << "kernels: " << describe_choice(measured) << " (" << measured_note << ")\n";
  out << "precision: " << tc.precision_recipe().describe() << "\n";
  // The least a rank must send per step: to sum its N fp32 gradients over dp (a ring all-reduce,
  // or ZeRO's reduce-scatter + parameter all-gather) 2 · 4N · (dp-1)/dp bytes, plus tensor
  // parallelism's activation all-reduces (tensor_parallel.hpp).
  const auto N = static_cast<uint64_t>(run.model.num_params());
  const auto dp = static_cast<uint64_t>(run.dp.size());
  const uint64_t dp_min_bytes = N * 8 * (dp - 1) / dp;
  const uint64_t tp_min_bytes = parallel::tp_min_bytes(cfg.model, run.tp.size(), pc.sp, run.BL * run.local_T());
  int64_t replicated = 0;  // of this rank's parameters, those every ep rank holds
  for (const ParamTensor& t : run.model.param_layout()) replicated += t.is_expert() ? 0 : t.numel;
  int64_t moe_layers = 0;  // in this rank's chunks
  for (size_t c = 0; c < run.model.num_chunks(); ++c) {
    for (size_t l = run.model.chunk(c).first; l < run.model.chunk(c).end; ++l) {
      moe_layers += run.model.desc().layers[l].kind == LayerKind::kMoe ? 1 : 0;
    }
  }
  const uint64_t ep_min_bytes = parallel::ep_min_bytes(cfg.model, run.expert_parallel() ? run.ep->size() : 1,
                                                       run.BL * run.T, moe_layers, replicated);
  int64_t attention_layers = 0;  // in this rank's chunks
  for (size_t c = 0; c < run.model.num_chunks(); ++c) {
    for (size_t l = run.model.chunk(c).first; l < run.model.chunk(c).end; ++l) {
      attention_layers += run.model.desc().layers[l].kind == LayerKind::kAttention ? 1 : 0;
    }
  }
  const uint64_t cp_min_bytes = parallel::cp_min_bytes(cfg.model, run.context_parallel() ? run.cp->size() : 1,
                                                       run.tp.size(), run.BL, attention_layers);
  costs.min_bytes = dp_min_bytes + tp_min_bytes + ep_min_bytes + cp_min_bytes;
  // The model's own gradient buffers: fp32, and in canonical mode the exact sums (a double and a
  // spill flag per element).
  costs.full_grad_bytes = N * (tc.mode == Mode::kCanonical ? sizeof(float) + sizeof(double) + 1 : sizeof(float));
  if (run.world.size() == 1) return costs;
  out << "parallel: " << mesh.describe() << (pc.sp ? ", sequence parallel" : "")
      << (run.context_parallel() ? str_cat(", cp_comm ", pc.cp_comm) : "") << ", zero " << pc.zero
      << ", reduce " << pc.reduce << "; rank batch " << run.BL << " (micro-batch " << run.MBL << "); " << N
      << " parameters per rank" << held_params_note(run) << "; optimizer state " << run.ddp.optimizer_state_bytes() << " bytes per rank (replicated: "
      << 8 * N << "); minimum sent per rank per step " << costs.min_bytes << " bytes (gradient sync " << dp_min_bytes
      << ", tensor parallel " << tp_min_bytes << (run.expert_parallel() ? str_cat(", expert parallel ", ep_min_bytes) : "")
      << (run.context_parallel() ? str_cat(", context parallel ", cp_min_bytes) : "")
      << ")\n";
  // Buckets as large as the model leave zero 2 nothing to save: say so rather than let a user
  // believe the gradient is sharded in memory.
  const uint64_t staging = run.ddp.staging_budget_bytes();
  if (staging > 0 && staging >= costs.full_grad_bytes) {
    out << "warning: ZeRO-2 stages up to " << staging << " gradient bytes per rank, as much as a full gradient: "
        << "[parallel] bucket_mb (" << std::setprecision(4) << pc.bucket_mb
        << ") is too large for this model to save gradient memory\n";
  }
  return costs;
}

// Every rank's loss and gradient norm become the worst of any rank's (NaN before infinity before
// the largest), and the ranks whose own were not finite, where others' were, are noted. They are
// equal on every rank unless something went wrong on one: a data-parallel replica whose reduced
// gradient was corrupted computes its own norm. The detectors that judge them must decide alike
// on every rank, or the ranks would part ways and wait for each other.
void agree_on_worst(comm::Communicator& world, StepRecord& r) {
  if (world.size() == 1) return;
  const uint64_t mine[2] = {std::bit_cast<uint32_t>(r.loss), std::bit_cast<uint32_t>(r.grad_norm)};
  const std::vector<uint64_t> all = detect::agreed_all_gather(world, mine);
  auto worst = [](float a, float b) { return std::isnan(a) || (!std::isnan(b) && a >= b) ? a : b; };
  std::vector<int> nonfinite;
  for (int rank = 0; rank < world.size(); ++rank) {
    const float loss = std::bit_cast<float>(static_cast<uint32_t>(all[2 * static_cast<size_t>(rank)]));
    const float norm = std::bit_cast<float>(static_cast<uint32_t>(all[2 * static_cast<size_t>(rank) + 1]));
    r.loss = worst(r.loss, loss);
    r.grad_norm = worst(r.grad_norm, norm);
    if (!std::isfinite(loss) || !std::isfinite(norm)) nonfinite.push_back(rank);
  }
  if (static_cast<int>(nonfinite.size()) < world.size()) r.nonfinite_ranks = std::move(nonfinite);
}

// The step itself: the batch, forward and backward over the micro-batches, the gradient reduction,
// clipping and AdamW, with the observers at their points. This rank computes dp group
// batch_group's part of the batch (its own, but for a buddy replay's).
StepRecord run_step(TrainRun& run, const LrSchedule& schedule, std::span<StepObserver* const> observers,
                    int64_t step, int64_t batch_group, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const auto t0 = std::chrono::steady_clock::now();
  const double waited_before = comm::thread_wait_seconds();
  auto bytes = [&] {
    return run.dp.stats().total() + (run.tensor_parallel() ? run.tp.stats().total() : 0) +
           (run.expert_parallel() ? run.ep->stats().total() : 0) + (run.context_parallel() ? run.cp->stats().total() : 0);
  };
  const uint64_t bytes_before = bytes();
  StepRecord r;
  r.step = step;
  r.lr = static_cast<float>(schedule.at(step));
  // The batch is drawn after begin_step, whose snapshot (rollback.hpp) holds the cursor before it.
  for (StepObserver* o : observers) o->begin_step(step);
  run.sampler.next_batch(run.B, batch_group * run.BL, run.BL, inputs.data(), targets.data());
  run.model.zero_grad();
  ChunkCombiner loss_sum;
  const float dloss = 1.0f / static_cast<float>(run.B * run.T);
  if (run.pipelined()) {
    sync_tied_copy(run.model, *run.pp);
    const StageTimes t =
        run_stage_passes(run.model, *run.pp, run.passes,
                         {inputs.data(), targets.data(), run.MBL, run.BL / run.MBL, batch_group * run.BL * run.T},
                         dloss, loss_sum);
    r.stage_compute_s = t.compute_s;
    r.stage_s = t.total_s;
  } else {
    run.model.forward_backward_batch(inputs.data(), targets.data(), run.BL, run.MBL, batch_group * run.BL * run.T,
                                     dloss, loss_sum);
  }
  if (Fp8State* fp8 = run.model.fp8()) combine_fp8_statistics(run.world, *fp8);
  if (run.tensor_parallel() && run.cfg.parallel.sp) run.ddp.sum_norm_grads_over_tp();
  run.ddp.reduce_gradients();
  r.overlap = run.ddp.overlap_stats();
  r.gathers = run.ddp.gather_stats();
  r.loss = run.ddp.reduce_loss(loss_sum) / static_cast<float>(run.B * run.T);
  if (run.pipelined()) run.pp->broadcast(&r.loss, 1, DType::kF32, run.pp->size() - 1);  // the last stage's loss
  for (StepObserver* o : observers) o->after_reduce(step, r.loss);
  r.grad_norm = run.ddp.clip_grad_norm(static_cast<float>(run.cfg.train.grad_clip));
  run.ddp.step(r.lr, step + 1);
  agree_on_worst(run.world, r);
  for (StepObserver* o : observers) o->after_update(step);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.wait_seconds = comm::thread_wait_seconds() - waited_before;
  r.comm_bytes = bytes() - bytes_before;
  return r;
}

// The loop on one rank of a (possibly single-rank) world.
TrainSummary train_on(const RunConfig& cfg, comm::Communicator& world, std::ostream& console) {
  std::ostream null_stream(nullptr);  // ranks other than 0 print nothing
  std::ostream& out = world.rank() == 0 ? console : null_stream;
  const TrainConfig& tc = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  CpuBackend backend({tc.threads, tc.isa, tc.fast_gemm});

  // Set-up: the mesh, the data, the model (this rank's part of it) and data parallelism over it.
  parallel::Mesh mesh({pc.dp, pc.tp, pc.pp, pc.ep, pc.cp}, world, cfg.source);
  // The faults to plant: one [inject], or a campaign's.
  const std::vector<Injection> faults = cfg.inject.campaign.empty()
                                            ? std::vector<Injection>{parse_injection(cfg.inject, cfg.source, cfg.model)}
                                            : parse_campaign(cfg.inject.campaign, cfg.model);
  const auto any_fault = [&](bool (*at)(const std::string&)) {
    return std::any_of(faults.begin(), faults.end(), [&](const Injection& f) { return at(f.site); });
  };
  // [verify] collectives, or an injection into a received message: the dp, tp, pp and cp groups carry
  // checksums beside their messages (verify/detect/verified_comm.hpp), or only let the injection
  // see what arrives.
  detect::CollectiveLog collective_log;
  detect::ReceiveHook on_received;  // the injector's, once it exists
  std::optional<detect::VerifiedCommunicator> verified_dp, verified_tp, verified_pp, verified_cp;
  if (world.size() > 1 && (cfg.verify.collectives || any_fault(is_comm_site))) {
    const detect::ReceiveHook hook = [&on_received](std::string_view group, std::string_view op,
                                                    std::span<const detect::ReceivedBytes> blocks) {
      if (on_received) on_received(group, op, blocks);
    };
    verified_dp.emplace(mesh.replicas(), collective_log, cfg.verify.collectives, hook);
    verified_tp.emplace(mesh.group(parallel::Axis::kTp), collective_log, cfg.verify.collectives, hook);
    verified_pp.emplace(mesh.group(parallel::Axis::kPp), collective_log, cfg.verify.collectives, hook);
    verified_cp.emplace(mesh.group(parallel::Axis::kCp), collective_log, cfg.verify.collectives, hook);
  }
  // The gradient reduction's group: dp, or dp x cp under context parallelism.
  comm::Communicator& dpc = verified_dp ? static_cast<comm::Communicator&>(*verified_dp) : mesh.replicas();
  comm::Communicator& tpc =
      verified_tp ? static_cast<comm::Communicator&>(*verified_tp) : mesh.group(parallel::Axis::kTp);
  const int64_t tp = tpc.size(), dp = mesh.size(parallel::Axis::kDp);
  const int64_t T = cfg.model.seq_len, B = tc.batch_size, MB = tc.micro_batch();
  // Expert parallelism: the batch splits over the data ranks, dp x ep.
  comm::Communicator& epc = mesh.group(parallel::Axis::kEp);
  parallel::check_ep_layout(cfg.model, epc.size(),
                            {.precision = tc.precision_recipe(), .buddy = cfg.verify.buddy_every > 0}, cfg.source);
  const parallel::DpBatch part = parallel::plan_dp_batch(B, MB, T, dp * epc.size(), tc.mode, cfg.source,
                                                         parallel::data_ranks_name(epc.size()));
  // Context parallelism: each rank holds T / cp positions of every sequence.
  comm::Communicator& cpc =
      verified_cp ? static_cast<comm::Communicator&>(*verified_cp) : mesh.group(parallel::Axis::kCp);
  parallel::check_cp_layout(cfg.model, cpc.size(),
                            {.precision = tc.precision_recipe(),
                             .pp = pc.pp,
                             .buddy = cfg.verify.buddy_every > 0,
                             .sp_dump = pc.sp && !cfg.dump.dir.empty(),
                             .reference = cfg.verify.reference_every > 0},
                            cfg.source);
  parallel::check_tp_layout(cfg.model, tp, pc.sp, part.local_micro * T / cpc.size(), tc.mode, cfg.source);
  const std::string fp8_problem =
      tc.precision_recipe().fp8_layout_problem(describe_model(cfg.model), tp, pc.sp, part.local_micro * T,
                                               dp * (part.local_batch / part.local_micro), tc.mode == Mode::kCanonical);
  LS_REQUIRE(fp8_problem.empty(), cfg.source, ": ", fp8_problem);
  // Pipeline parallelism: this rank's stage of the layer list and its row of the schedule.
  comm::Communicator& ppc =
      verified_pp ? static_cast<comm::Communicator&>(*verified_pp) : mesh.group(parallel::Axis::kPp);
  const Pipeline pipeline = plan_pipeline(cfg, ppc.rank(), ppc.size(), part.local_batch / part.local_micro);
  check_zero3(cfg, faults);
  LS_REQUIRE(cfg.verify.buddy_every == 0 || dp >= 2, cfg.source, ": [verify] buddy_every (", cfg.verify.buddy_every,
             ") needs data parallelism (a buddy is another dp group; this run has dp = ", dp, ")");

  data::TokenFile train_file(cfg.data.train);
  train_file.check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
  std::optional<data::TokenFile> val_file;
  std::optional<data::EvalReader> val_reader;
  if (!cfg.data.val.empty()) {
    val_file.emplace(cfg.data.val);
    val_file->check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
    val_reader.emplace(*val_file, T);
  }
  data::TrainSampler sampler(train_file, T, tc.seed);

  // Tensor parallelism: a plan gives the model this rank's shards and the ops that reduce over tp.
  std::optional<parallel::CommTpGroup> tp_group;
  std::optional<parallel::TensorParallelPlan> tp_plan;
  if (tp > 1) {
    tp_group.emplace(tpc);
    tp_plan.emplace(*tp_group, pc.sp);
  }
  // Expert parallelism: this rank's routed experts, and the exchange of their rows over ep.
  const ModelPlan one_device;
  std::optional<parallel::CommExpertExchange> expert_exchange;
  std::optional<parallel::ExpertParallelPlan> ep_plan;
  if (epc.size() > 1) {
    expert_exchange.emplace(epc);
    ep_plan.emplace(tp_plan ? static_cast<const ModelPlan&>(*tp_plan) : one_device, *expert_exchange);
  }
  const ModelPlan* plan = ep_plan ? static_cast<const ModelPlan*>(&*ep_plan) : tp_plan ? &*tp_plan : nullptr;
  const parallel::CpComm cp_comm = parallel::parse_cp_comm(pc.cp_comm, cfg.source);
  std::optional<parallel::ContextParallelPlan> cp_plan;
  if (cpc.size() > 1) {
    cp_plan.emplace(plan != nullptr ? *plan : one_device, cpc, cp_comm);
    plan = &*cp_plan;
  }
  // [verify] abft, or an injection at a GEMM product: the ops run through the backend that watches
  // the linear layers' products (verify/detect/abft.hpp); it changes no bit of them.
  std::optional<detect::AbftBackend> abft;
  if (cfg.verify.abft || any_fault(is_gemm_site)) abft.emplace(backend, cfg.verify.abft);
  Model model(cfg.model, tc.mode, part.local_micro,
              {.plan = plan,
               .backend = abft ? static_cast<Backend*>(&*abft) : &backend,
               .precision = tc.precision_recipe(),
               .chunks = pipeline.chunks,
               .recompute = parse_recompute(tc.recompute, cfg.source + ": [train] recompute"),
               .split_backward = pipeline.split_backward,
               .sharded_params = pc.zero == 3 && dpc.size() > 1});
  if (abft) abft->name_weights(model);
  const auto reduce = pc.reduce == "exact" ? parallel::ReduceMode::kExact : parallel::ReduceMode::kFast;
  // The ranks holding parts of one copy of this stage's tensors, the same ones: dp × tp (the world
  // while pp = ep = 1), what the gradient norm combines ZeRO-2 and 3 shards over.
  std::unique_ptr<comm::Communicator> stage_group;
  if (ppc.size() > 1 || epc.size() > 1) {
    stage_group = world.split(static_cast<int>(ppc.rank() * epc.size() + epc.rank()), world.rank(), "dp_tp");
  }
  parallel::DataParallel ddp(model, dpc, tpc, stage_group ? *stage_group : world, static_cast<int>(pc.zero), reduce,
                             tc.adamw(),
                             parallel::DpOptions{static_cast<int64_t>(pc.bucket_mb * (1 << 20)), pc.overlap,
                                                 tp > 1 && pc.sp, pipeline.split_backward, &ppc, &epc});
  TrainRun run{cfg,  world, dpc, tpc, model, ddp, sampler, out, T, B, MB, part.local_batch, part.local_micro,
               build_param_layout(cfg.model), &ppc, pipeline.passes, stage_params(model.desc(), pipeline.stages),
               &epc, mesh.data_rank(), &cpc};

  // Observers, in the order they act at each point of a step. [dump] and [inject] give the model a
  // hook only while one of them is on, so that both cost nothing when off; the injection acts
  // first, so a dump records the tensor as the model uses it.
  // An injected fault is on a process (its device), as the launcher numbers them: the same as the
  // run's ranks unless `lockstep launch --spares` holds some back.
  const int process = std::max(0, comm::MpiRuntime::launcher_rank());
  const int processes = std::max(world.size(), comm::MpiRuntime::launcher_size());
  LS_REQUIRE(cfg.inject.rank < processes, cfg.source, ": [inject] rank (", cfg.inject.rank,
             ") is not a rank of this run (", processes, " ranks)");
  for (const Injection& f : faults) {
    const int64_t done = f.step + 1;
    LS_REQUIRE(!is_checkpoint_site(f.site) ||
                   (!cfg.checkpoint.dir.empty() && ((cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) ||
                                                    done == tc.steps || f.step == tc.stop_after)),
               cfg.source, ": [inject] site ", f.site, ": no checkpoint is written after step ", f.step,
               " ([checkpoint] dir and every; the last step's is always written)");
  }
  // The ring keeps no attention probabilities: nothing for a fault there to act on.
  for (const Injection& f : faults) {
    LS_REQUIRE(!(cpc.size() > 1 && cp_comm == parallel::CpComm::kP2p && f.site.ends_with("/attn/att")), cfg.source,
               ": [inject] site ",
               f.site, ": [parallel] cp_comm = \"p2p\" holds no attention probabilities (the ring keeps each row's max "
               "and Z); inject into attn/out or use cp_comm = \"all_gather\"");
  }
  Injector injector(faults, process, model, ddp.moments_m(), ddp.moments_v(), [&] { return ddp.reduced_grads(); });
  // Under pipeline parallelism a site is on one stage: an [inject] that no rank can act on is an error.
  if (ppc.size() > 1 && cfg.inject.campaign.empty() && faults.front().kind != Injection::Kind::kNone) {
    const std::vector<int> acting = world.all_gather(injector.acts_here() ? 1 : 0);
    LS_REQUIRE(std::find(acting.begin(), acting.end(), 1) != acting.end(), cfg.source, ": [inject] site ",
               cfg.inject.site, (cfg.inject.rank >= 0 ? str_cat(" on rank ", cfg.inject.rank) : std::string()),
               ": no rank holds it (with [parallel] pp = ", ppc.size(),
               " a layer's tensors and parameters are on its pipeline stage only; [inject] rank must be a rank of "
               "that stage)");
  }
  std::optional<verify::DumpWriter> dump;
  if (!cfg.dump.dir.empty()) {
    // Batch tensors are gathered over tp (the hooks see shards) and then over the data ranks (dp,
    // or dp x ep) to the rank that is rank 0 of both, and each pipeline stage's listed by the
    // first, so a dump compares directly with a single process's.
    dump.emplace(cfg.dump.dir, cfg.dump.tensors, cfg.dump.steps, cfg.to_json(),
                 nlohmann::json{{"dp", dp}, {"tp", pc.tp}, {"sp", pc.sp}, {"zero", pc.zero}, {"pp", pc.pp},
                                {"ep", pc.ep}, {"cp", pc.cp}, {"mode", mode_name(tc.mode)},
                                {"micro_batch", part.local_micro}},
                 &mesh.data(), verify::DumpTp{tp > 1 ? &tpc : nullptr, &model.desc(), pc.sp}, &ppc,
                 verify::DumpCp{cpc.size() > 1 ? &cpc : nullptr, parallel::every_rank_blocks(T, cpc.size())},
                 part.local_micro);
  }
  if (injector.watches_messages()) {
    on_received = [&](std::string_view group, std::string_view op, std::span<const detect::ReceivedBytes> blocks) {
      injector.on_received(group, op, blocks);
    };
  }
  if (injector.watches_products()) {
    abft->set_product_hook(
        [&](std::string_view site, const detect::ProductView& product) { injector.on_product(site, product); });
  }
  // Buddy replay's witness and the reference check see each tensor as the model goes on with it,
  // after any injection. Their findings go to the log made below.
  detect::TensorWitness witness;
  std::optional<detect::ReferenceCheck> reference;
  if (dump || injector.watches_tensors() || cfg.verify.buddy_every > 0 || cfg.verify.reference_every > 0) {
    model.set_hook([&](std::string_view name, const TensorView& t) {
      injector.on_tensor(name, t);
      if (dump) dump->observe(name, t.f32(), t.shape.dims());
      witness.observe(name, t);
      if (reference) reference->observe(name, t);
    });
  }

  // Resume, or start from the initial model.
  TrainSummary summary;
  const Resumed resumed = resume(run);
  summary.first_step = resumed.step;
  if (summary.first_step == 0) {
    if (ddp.sharded_params() != nullptr) {
      model.init_parameters(ddp.shard_first(), ddp.shard_end(), run.held_params().data());
      run.held_params_written();
    } else {
      model.init_parameters();
    }
    if (!tc.init_from.empty()) run.with_whole_params([&] { out << init_parameters_from(run, tc.init_from) << "\n"; });
  }
  LS_REQUIRE(tc.stop_after < 0 || tc.stop_after >= summary.first_step, cfg.source, ": [train] stop_after (",
             tc.stop_after, ") is a step before the one this run resumes from (", summary.first_step, ", ",
             cfg.checkpoint.dir, ")");

  const Progress::Costs costs = report_setup(run, mesh, backend);
  if (!pipeline.description.empty()) out << pipeline.description << "\n";
  MetricsWriter metrics;
  if (world.rank() == 0 && !cfg.log.metrics.empty()) metrics = MetricsWriter(cfg.log.metrics, summary.first_step > 0);
  std::optional<DumpSteps> dump_steps;
  if (dump) dump_steps.emplace(run, *dump);
  Progress progress(run, metrics, costs);
  Evaluation evaluation(run, metrics, val_reader ? &*val_reader : nullptr);
  std::vector<StepObserver*> observers;
  Checkpointer checkpoints(run, observers);
  checkpoints.on_saved([&](const std::string& dir, int64_t step_done) { injector.on_checkpoint(dir, step_done); });
  // The detectors judge a step after its progress line and before anything keeps its state: a
  // finding that stops the run leaves the last checkpoint the last good one.
  const VerifyConfig& vc = cfg.verify;
  detect::FindingLog findings(out, [&](const nlohmann::json& j) {
    if (metrics.enabled()) metrics.write(j);
  });
  const detect::FaultAction on_fault = detect::parse_fault_action(vc.on_fault, "[verify] on_fault", true);
  detect::NonFiniteDetector nonfinite(findings, on_fault);
  std::optional<detect::SpikeDetector> spikes;
  if (vc.spikes) {
    spikes.emplace(spike_rule(vc), findings, detect::parse_fault_action(vc.on_spike, "[verify] on_spike"));
  }
  std::optional<detect::CollectiveDetector> collective_detector;
  if (cfg.verify.collectives && world.size() > 1) collective_detector.emplace(collective_log, world, findings, on_fault);
  std::optional<detect::AbftDetector> abft_detector;
  if (abft && abft->checking()) abft_detector.emplace(*abft, world, findings, on_fault);
  // The state at rest is hashed first after the update, so that what changes it later (an
  // injected fault stands for a memory error) is found before the next step uses it.
  std::optional<detect::StateAtRestDetector> at_rest;
  if (vc.state_at_rest) {
    at_rest.emplace(resting_state(run.held_params(), ddp.moments_m(), ddp.moments_v()), world, findings, on_fault);
  }
  if (vc.reference_every > 0) {
    reference.emplace(model, detect::sampled_ops(model, tp, pc.sp), cfg.train.precision_recipe(), vc.reference_every,
                      world, findings, on_fault);
  }
  std::optional<detect::StragglerDetector> stragglers;
  if (vc.stragglers && world.size() > 1) {
    stragglers.emplace(detect::StragglerRule{vc.straggler_window, vc.straggler_threshold, vc.straggler_patience}, world,
                       findings, detect::parse_fault_action(vc.on_straggler, "[verify] on_straggler"));
  }
  std::optional<detect::Fp8Sentinel> fp8_sentinel;
  if (model.fp8() != nullptr) {
    fp8_sentinel.emplace(model, world, fp8_sentinel_rule(vc),
                         findings, detect::parse_fault_action(vc.on_fp8, "[verify] on_fp8"),
                         [&](const nlohmann::json& j) {
                           if (metrics.enabled()) metrics.write(j);
                         },
                         out);
  }
  std::optional<detect::ReplicaDetector> replicas;
  // Under ZeRO-3 no parameter is replicated over dp: each rank holds a different shard.
  if (vc.replicas && world.size() > 1 && ddp.sharded_params() == nullptr) {
    replicas.emplace(model, world, dpc, tpc, findings, on_fault, at_rest ? &*at_rest : nullptr);
  }
  if (at_rest) observers.push_back(&*at_rest);
  // A fault campaign judges each fault's step before the next step's snapshot is taken.
  std::optional<CampaignRecorder> campaign;
  if (!cfg.inject.campaign.empty()) {
    campaign.emplace(run, faults, injector, cfg.inject.campaign_out);
    findings.listen([&](const detect::Finding& f) { campaign->on_finding(f); });
    observers.push_back(&*campaign);
  }
  // [verify] on_fault = "rollback", replay_every or buddy_every: the snapshot of each step, taken
  // once its state at rest is checked. A replay runs the step again with only what it needs: the
  // injection (a persistent fault meets the replay too), the snapshot and the state at rest's hashes.
  std::optional<StepSnapshots> snapshots;
  std::optional<StepReplay> replay;
  std::optional<BuddyReplay> buddy;
  std::vector<StepObserver*> replay_observers;
  if (on_fault == detect::FaultAction::kRollback || vc.replay_every > 0 || vc.buddy_every > 0) {
    snapshots.emplace(run, observers, static_cast<int>(vc.max_replays));
    observers.push_back(&*snapshots);
    if (at_rest) replay_observers.push_back(&*at_rest);
    replay_observers.push_back(&*snapshots);
    replay_observers.push_back(&injector);
  }
  if (vc.replay_every > 0) replay.emplace(run, *snapshots, findings, on_fault, vc.replay_every);
  if (vc.buddy_every > 0) {
    buddy.emplace(run, *snapshots, witness, findings, on_fault, vc.buddy_every);
    observers.push_back(&*buddy);
  }
  observers.push_back(&injector);
  if (dump_steps) observers.push_back(&*dump_steps);
  observers.push_back(&progress);
  Fp8Statistics fp8_statistics(run, metrics);
  if (model.fp8() != nullptr) observers.push_back(&fp8_statistics);
  MoeStatistics moe_statistics(run, metrics);
  if (cfg.model.moe_experts > 0) observers.push_back(&moe_statistics);
  observers.push_back(&nonfinite);
  if (spikes) observers.push_back(&*spikes);
  if (collective_detector) observers.push_back(&*collective_detector);
  if (abft_detector) observers.push_back(&*abft_detector);
  if (reference) observers.push_back(&*reference);
  if (replicas) observers.push_back(&*replicas);
  if (stragglers) observers.push_back(&*stragglers);
  if (fp8_sentinel) observers.push_back(&*fp8_sentinel);
  observers.push_back(&evaluation);
  observers.push_back(&checkpoints);
  restore_observers(observers, resumed.observers);

  g_stop_signal.store(0);
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  std::vector<int32_t> inputs(static_cast<size_t>(run.BL * T)), targets(inputs.size());
  const LrSchedule schedule{tc.lr, tc.min_lr, tc.warmup, tc.steps};
  double total_time = 0, stage_compute_s = 0, stage_s = 0;
  int64_t steps_this_run = 0;
  int64_t step = summary.first_step;
  // Every rank met a finding that rolls back: all of them run the snapshot's step again, or stop
  // when its replays are spent (buddy replay first pins the fault to its rank where it can).
  const auto roll_back = [&](const detect::FaultRollback& e) {
    if (buddy && snapshots->replays_spent()) {
      buddy->pin(snapshots->step(), [&](int64_t group, bool) {
        run_step(run, schedule, replay_observers, snapshots->step(), group, inputs, targets);
      });
    }
    return snapshots->restore(e) - 1;
  };
  for (; step < tc.steps; ++step) {
    StepRecord r;
    try {
      const int64_t own_group = run.data_rank;
      r = run_step(run, schedule, observers, step, own_group, inputs, targets);
      if (replay && replay->due(step)) {
        replay->check(step, [&] { r = run_step(run, schedule, replay_observers, step, own_group, inputs, targets); });
      }
      if (buddy && buddy->due(step)) {
        buddy->check(step, [&](int64_t group, bool keep_record) {
          const StepRecord again = run_step(run, schedule, replay_observers, step, group, inputs, targets);
          if (keep_record) r = again;
        });
      }
    } catch (const detect::FaultRollback& e) {
      step = roll_back(e);
      continue;
    } catch (const InputError& e) {
      // Past the set-up the ranks differ (their micro-batches, an injection on one rank): the error
      // is this rank's own while the others wait in the step's collectives. It ends the job here.
      if (world.size() == 1) throw;
      comm::abort_job(str_cat("error: ", e.what()), 2);
    }
    // [train] stop_after: this step ends the run as the last one would (evaluation, checkpoint).
    r.last = r.done() == tc.steps || step == tc.stop_after;
    // Every rank stops after the same step: a signal seen by any rank stops all of them.
    // Agreed (three copies, read by majority): a corrupted message must not stop one rank alone.
    int64_t signal = g_stop_signal.load();
    if (world.size() > 1) {
      const uint64_t mine = static_cast<uint64_t>(signal);
      for (uint64_t s : detect::agreed_all_gather(world, std::span<const uint64_t>(&mine, 1))) {
        signal = std::max(signal, static_cast<int64_t>(s));
      }
    }
    // A slow rank found with [verify] on_straggler = "stop" (every rank judged the same figures).
    const bool slow_rank = stragglers && stragglers->stop_requested();
    r.stopping = signal != 0 || slow_rank;
    try {
      for (StepObserver* o : observers) o->end_step(r);
    } catch (const detect::FaultRollback& e) {
      step = roll_back(e);
      continue;
    }
    total_time += r.seconds;
    if (steps_this_run > 0) {  // the first step warms up
      stage_compute_s += r.stage_compute_s;
      stage_s += r.stage_s;
    }
    ++steps_this_run;
    summary.last_loss = r.loss;
    if (r.stopping) {
      if (signal != 0) {
        out << "stopped by signal " << signal << " after step " << r.done()
            << " (checkpoint saved; run the same command to resume)\n";
        summary.exit_status = 130;
      } else {
        out << "stopped after step " << r.done() << " on the slow rank found ([verify] on_straggler = \"stop\"; "
            << "checkpoint saved; `lockstep launch --spares` restarts without it)\n";
        summary.exit_status = detect::kExitSlowRank;
      }
      ++step;
      break;
    }
    if (step == tc.stop_after && r.done() < tc.steps) {
      out << "stopped early: " << r.done() << " of " << tc.steps << " steps done ([train] stop_after = "
          << tc.stop_after << "; the same command without it continues the run)\n";
      ++step;
      break;
    }
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);

  summary.steps_done = step;
  summary.val_loss = evaluation.last_loss();
  summary.tokens_per_s = steps_this_run > 0 ? static_cast<double>(steps_this_run * B * T) / total_time : 0;
  // Every rank's peak over the steps (a step record has rank 0's), before the hash below gathers
  // the parameters: the fullest rank is the one a layout must fit.
  const std::vector<double> peaks = world.all_gather(peak_memory_mib());
  if (metrics.enabled()) metrics.write({{"step", summary.steps_done}, {"peak_mem_mib_by_rank", peaks}});
  summary.model_hash = model_hash(run);
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
  if (run.pipelined()) {
    out << measured_bubble(world, mesh.size(parallel::Axis::kPp), mesh.size(parallel::Axis::kTp), pipeline.unit_bubble,
                           stage_compute_s, stage_s)
        << "\n";
  }
  if (replay) out << "replays: " << replay->replays() << " (every " << vc.replay_every << " steps, compared bitwise)\n";
  if (buddy) {
    out << "buddy replays: " << buddy->runs() << " runs (every " << vc.buddy_every
        << " steps each dp group computed its neighbour's batch too, compared tensor by tensor)\n";
  }
  if (snapshots && snapshots->rollbacks() > 0) {
    out << "rollbacks: " << snapshots->rollbacks() << " (each step replayed from its in-memory snapshot)\n";
  }
  if (reference) {
    const detect::ReferenceStats& s = reference->stats();
    out << "reference checks: " << s.checks << " ops re-checked on rank 0 (every " << vc.reference_every
        << " steps, in turn); the largest passing |trainer - reference| was " << std::setprecision(3) << std::scientific
        << s.max_ratio << std::defaultfloat << " of its bound; " << std::fixed << std::setprecision(2) << s.seconds
        << " s checking\n";
  }
  if (abft && abft->checking()) {
    const detect::AbftStats& a = abft->stats();
    out << "abft: " << a.checks << " products checked on rank 0, " << a.faults << " failed; the largest "
        << "|checksum - predicted| of a passing one was " << std::setprecision(3) << std::scientific
        << a.max_clean_ratio << std::defaultfloat << " of its threshold; " << std::fixed << std::setprecision(2)
        << a.seconds << " s checking\n";
  }
  return summary;
}

}  // namespace

TrainSummary train(const RunConfig& cfg, std::ostream& out) {
  const comm::JobWorld job = comm::job_world(cfg.parallel.timeout_s);
  return train_on(cfg, *job.world, out);
}

}  // namespace lockstep
