// `lockstep bench --config FILE [--json FILE] [--tokens-out FILE] [--bench.steps=N] [--bench.warmup=K]
//  [--section.key=value ...]`, or under mpirun `lockstep bench --collectives [--bench.repeats=N]
//  [--bench.largest_kib=K] [--json FILE]`
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <span>

#include "src/cli/commands.hpp"
#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/plan/collective_bench.hpp"
#include "src/plan/compute_profile.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "src/train/bench.hpp"
#include "src/train/bench_pair.hpp"
#include "src/train/config.hpp"
#include "src/train/metrics.hpp"

namespace lockstep::cli {

namespace {

int64_t parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LS_REQUIRE(used == text.size() && v >= 0, "--", option, ": expected a non-negative integer, got '", text, "'");
  return v;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  LS_REQUIRE(f.is_open(), "--json: cannot open '", path, "' for writing");
  f << j.dump(2) << '\n';
  LS_REQUIRE(f.good(), "--json: write to '", path, "' failed");
  std::cout << "wrote " << path << "\n";
}

int bench_collectives(Args& args) {
  const auto json_path = args.take("json");
  const int64_t repeats = parse_count("bench.repeats", args.take_or("bench.repeats", "20"));
  // The largest message a job sends: larger sizes are not timed (default: every size).
  const int64_t largest_kib = parse_count(
      "bench.largest_kib", args.take_or("bench.largest_kib", std::to_string(plan::kMaxCollectiveFloats * 4 / 1024)));
  LS_REQUIRE(largest_kib >= 1, "--bench.largest_kib: expected at least 1, got ", largest_kib);
  args.finish("bench --collectives");
  const double largest_bytes = static_cast<double>(largest_kib) * 1024;
  const comm::JobWorld job = comm::job_world(600);
  CpuBackend backend(CpuSettings{1});  // a rank of the local cluster: one thread
  const plan::CollectiveBench r = plan::bench_collectives(*job.world, backend, repeats, largest_bytes);
  if (job.world->rank() != 0) return 0;
  if (r.ranks == 1) {
    std::cout << "collectives: one process, nothing to time (run it under mpirun)\n";
    if (json_path) write_json(*json_path, r.to_json());
    return 0;
  }
  std::cout << "collectives: all-reduce over " << r.ranks << " ranks (median of " << repeats
            << ", the slowest rank's time): of fp32 sums, and exact (canonical mode's), and the exact\n"
            << "reduce-scatter alone into running sums (ZeRO-2's), split evenly and owned by one rank, and fast mode's\n"
            << "exact reduce-scatter of fp32 values, the same two ways\n";
  for (size_t i = 0; i < r.all_reduce.size(); ++i) {
    const plan::CollectiveSample &s = r.all_reduce[i], &e = r.exact_all_reduce[i], &z = r.exact_reduce_scatter[i],
                                 &o = r.exact_reduce_scatter_owned[i], &fz = r.exact_fp32_reduce_scatter[i],
                                 &fo = r.exact_fp32_reduce_scatter_owned[i];
    std::cout << "  " << std::setw(10) << static_cast<int64_t>(s.bytes) << " bytes  " << std::fixed << std::setprecision(1)
              << std::setw(9) << s.seconds * 1e6 << " us  " << std::setprecision(2) << std::setw(7)
              << s.bytes / s.seconds / 1e9 << " GB/s   exact " << std::setprecision(1) << std::setw(9) << e.seconds * 1e6
              << " us   exact reduce-scatter " << std::setw(9) << z.seconds * 1e6 << " us, owned " << std::setw(9)
              << o.seconds * 1e6 << " us   of fp32 " << std::setw(9) << fz.seconds * 1e6 << " us, owned " << std::setw(9)
              << fo.seconds * 1e6 << " us\n";
  }
  std::cout << "all-gather of fp32 parts: back to back, and one at a time from and into buffers evicted from the "
               "caches (ZeRO-3's layer gathers)\n";
  for (size_t i = 0; i < r.all_gather.size(); ++i) {
    const plan::CollectiveSample &g = r.all_gather[i], &c = r.layer_gather[i];
    std::cout << "  " << std::setw(10) << static_cast<int64_t>(g.bytes) << " bytes  " << std::setprecision(1)
              << std::setw(9) << g.seconds * 1e6 << " us   evicted " << std::setw(9) << c.seconds * 1e6 << " us\n";
  }
  std::cout << "ring model t = 2(n-1) alpha + 2(n-1)/n S/beta: alpha " << std::setprecision(2) << r.fit.latency * 1e6
            << " us, beta " << r.fit.bandwidth / 1e9 << " GB/s\n"
            << "skew at a synchronisation: " << std::setprecision(1) << 100 * r.skew.share
            << "% of the compute before it (segments of " << r.skew.segment_seconds * 1e3 << " ms each followed by a 4 KiB "
            << "all-reduce, against both apart; the median of " << r.skew.rounds << " rounds)\n";
  if (json_path) write_json(*json_path, r.to_json());
  return 0;
}

int bench_passes(Args& args) {
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "lockstep bench --passes: --config FILE is required");
  const auto json_path = args.take("json");
  const int64_t repeats = parse_count("bench.repeats", args.take_or("bench.repeats", "5"));
  // One tensor- and context-parallel shape and micro-batch only (every recomputation of it).
  const auto only_tp = args.take("bench.tp"), only_sp = args.take("bench.sp"), only_cp = args.take("bench.cp"),
             only_cp_comm = args.take("bench.cp_comm"), only_micro = args.take("bench.micro");
  const auto overrides = args.take_dotted();
  args.finish("bench --passes");
  LS_REQUIRE(!only_sp || *only_sp == "true" || *only_sp == "false", "--bench.sp: expected true or false, got '",
             *only_sp, "'");
  const std::optional<bool> ring =
      only_cp_comm ? std::optional(parallel::parse_cp_comm(*only_cp_comm, "--bench.cp_comm") == parallel::CpComm::kP2p)
                   : std::nullopt;
  const RunConfig cfg = load_run_config(*config, overrides, ConfigUse::kBench);
  const comm::JobWorld job = comm::job_world(600);
  comm::Communicator& world = *job.world;
  // The GEMMs the trainer chooses at start-up (fast mode's), measured as it measures them on a
  // cold kernel cache: every rank at once, which also warms the cores up before the timing.
  const CpuBackend backend({1, cfg.train.isa, cfg.train.fast_gemm});
  const GemmPeak peak = backend.measure_gemm_peak();
  backend.choose_gemms(peak);
  // The largest rank's memory, the highest rank's peaks; a bf16 weight copy where any rank reads one.
  double measured[] = {resident_memory_mib(), peak.gflops, peak.gflops_for(Operands::kBf16),
                       backend.rounds_bf16_as_read(cfg.train.mode) ? 0.0 : 1.0};
  world.all_reduce(std::span<double>(measured), comm::ReduceOp::kMax);
  plan::ComputeProfile profile;
  profile.runtime_bytes = measured[0] * (1 << 20);
  profile.peak_fp32_flops = measured[1] * 1e9;
  profile.peak_bf16_flops = measured[2] * 1e9;
  profile.bf16_weight_copy = measured[3] > 0;
  std::vector<plan::PassShape> shapes = plan::profile_shapes(cfg, world.size(), cfg.train.batch_size);
  const std::optional<int64_t> tp = only_tp ? std::optional(parse_count("bench.tp", *only_tp)) : std::nullopt;
  const std::optional<int64_t> cp = only_cp ? std::optional(parse_count("bench.cp", *only_cp)) : std::nullopt;
  const std::optional<int64_t> micro =
      only_micro ? std::optional(parse_count("bench.micro", *only_micro)) : std::nullopt;
  std::erase_if(shapes, [&](const plan::PassShape& s) {
    return (tp && s.tp != *tp) || (only_sp && s.sp != (*only_sp == "true")) || (cp && s.cp != *cp) ||
           (ring && s.cp > 1 && s.ring != *ring) || (micro && s.micro_batch != *micro);
  });
  LS_REQUIRE(!shapes.empty(), "lockstep bench --passes: no shape of ", *config, " on ", world.size(),
             " ranks is left by --bench.tp, --bench.sp, --bench.cp, --bench.cp_comm and --bench.micro");
  for (const plan::PassShape& shape : shapes) {
    world.barrier();  // every rank times the same shape at once
    const plan::PassTimes t = plan::time_passes(cfg, shape, repeats);
    // The slowest rank's: a layout's ranks wait for it.
    double slowest[] = {t.forward, t.backward, t.optimizer, t.backward_input, t.backward_weight, t.state_at_rest};
    world.all_reduce(std::span<double>(slowest), comm::ReduceOp::kMax);
    profile.set(shape, {slowest[0], slowest[1], slowest[2], slowest[3], slowest[4], slowest[5]});
  }
  if (world.rank() != 0) return 0;
  std::cout << "passes: " << *config << ", one thread on each of " << world.size()
            << " ranks at once (the slowest rank's median of " << repeats << "); a rank holds " << std::fixed
            << std::setprecision(0) << profile.runtime_bytes / (1 << 20) << " MiB before its model\n"
            << "  tp  sp  cp  cp_comm     micro-batch  recompute  forward ms  backward ms  optimizer ms  state at rest ms  split backward ms (input + weights)\n";
  for (const auto& [s, t] : profile.times()) {
    std::cout << std::setw(4) << s.tp << std::setw(4) << (s.sp ? "sp" : "-") << std::setw(4) << s.cp << "  "
              << std::left << std::setw(10) << (s.cp == 1 ? "-" : parallel::cp_comm_name(s.ring)) << std::right << std::setw(13)
              << s.micro_batch << std::setw(11) << recompute_name(s.recompute) << std::fixed << std::setprecision(2) << std::setw(12)
              << t.forward * 1e3 << std::setw(13) << t.backward * 1e3 << std::setw(14) << t.optimizer * 1e3
              << std::setw(18) << t.state_at_rest * 1e3;
    if (s.recompute == Recompute::kNone) {
      std::cout << std::setw(12) << t.backward_input * 1e3 << " + " << t.backward_weight * 1e3;
    }
    std::cout << "\n";
  }
  if (json_path) write_json(*json_path, profile.to_json());
  return 0;
}

}  // namespace

int cmd_bench(Args& args) {
  if (args.take_flag("collectives")) return bench_collectives(args);
  if (args.take_flag("passes")) return bench_passes(args);
  if (args.take_flag("help")) {
    std::cout << "usage: lockstep bench --config FILE [--json FILE] [--tokens-out FILE] [--bench.steps=N]\n"
                 "                      [--bench.warmup=K] [--section.key=value ...]\n"
                 "  times the training step of the config's model (mode and threads from [train]):\n"
                 "  K warm-up steps (default 2), then N timed steps (default 10); prints median and spread\n"
                 "  of step time, tokens/s, FLOP/s (6*N + 12*L*d_model*seq_len per token), MFU against an\n"
                 "  sgemm peak measured in the same process, phases and peak memory; --json writes them.\n"
                 "  Without [data] train the tokens are synthetic (uniform over the vocabulary, fixed seed).\n"
                 "  --tokens-out FILE writes every step's batch: int32, (steps, 2, batch, seq_len), inputs\n"
                 "  then targets; the JSON has each step's loss and learning rate (losses, lrs).\n"
                 "  --bench.against=KEY=VALUE[,KEY=VALUE...] times the run against a baseline that differs by\n"
                 "  those settings (train.precision=fp32, train.mode=fast, ...), in one process, their steps\n"
                 "  alternating, and prints the baseline's step time over the run's, step by step.\n"
                 "       mpirun -np N lockstep bench --collectives [--bench.repeats=R] [--bench.largest_kib=K] [--json FILE]\n"
                 "  times the all-reduce over 4 KiB to 16 MiB, or to the first size that holds K KiB (median of\n"
                 "  R, default 20) and fits the ring model's latency and bandwidth (the planner's: lockstep plan\n"
                 "  --cluster local).\n"
                 "       [mpirun -np N] lockstep bench --passes --config FILE [--bench.repeats=R] [--bench.tp=T]\n"
                 "                      [--bench.sp=true|false] [--bench.cp=C] [--bench.cp_comm=all_gather|p2p]\n"
                 "                      [--bench.micro=M] [--json FILE]\n"
                 "  times one rank's forward, backward and update (one thread) for each tensor- and context-\n"
                 "  parallel shape (cp by all-gather and by the ring), micro-batch and recomputation the\n"
                 "  planner searches, on every rank at once (the slowest rank's median of R, default 5), or\n"
                 "  only those --bench.tp, .sp, .cp, .cp_comm and .micro name; the update: zeroing and\n"
                 "  rounding the gradients, their norm, AdamW.\n";
    return 0;
  }
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "lockstep bench: --config FILE is required");
  const auto json_path = args.take("json");
  BenchOptions opt;
  if (auto v = args.take("tokens-out")) opt.tokens_out = *v;
  if (auto v = args.take("bench.steps")) opt.steps = parse_count("bench.steps", *v);
  if (auto v = args.take("bench.warmup")) opt.warmup = parse_count("bench.warmup", *v);
  const auto against = args.take("bench.against");
  const auto overrides = args.take_dotted();
  args.finish("bench");
  LS_REQUIRE(args.positionals().empty(), "lockstep bench: unexpected argument '", args.positionals()[0], "'");
  const RunConfig cfg = load_run_config(*config, overrides, ConfigUse::kBench);
  if (against) {
    LS_REQUIRE(opt.tokens_out.empty(), "--tokens-out: not with --bench.against");
    const auto changes = parse_against(*against, "--bench.against");
    std::vector<std::pair<std::string, std::string>> baseline = overrides;
    baseline.insert(baseline.end(), changes.begin(), changes.end());
    const PairedBench r =
        run_paired_bench(cfg, load_run_config(*config, baseline, ConfigUse::kBench), *against, opt, std::cout);
    if (json_path) write_json(*json_path, r.to_json());
    return 0;
  }
  const BenchResult r = run_bench(cfg, opt, std::cout);
  if (json_path) write_json(*json_path, r.to_json(cfg));
  return 0;
}

}  // namespace lockstep::cli
