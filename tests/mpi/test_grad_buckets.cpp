// Bucketed gradient reduction overlapped with the backward pass, on a real Model, the whole world as
// the dp group (2, 3 and 4 ranks), two steps (the schedule restarts every step):
//  - for canonical and fast mode, exact and fast reduction, zero 0, 1 and 2, buckets of one and of
//    four 64-element chunks (smaller than any weight tensor), a few tensors, and bigger than the model, reduced
//    on the worker during the backward: gradients after reduce_gradients(), the gradient norm and
//    the parameters after AdamW are bitwise those of one bucket reduced after the backward (the
//    reduction as it was before buckets);
//  - canonical mode with exact reduction: bitwise the single-process step over the whole batch
//    (two micro-batches per rank, which zero 2 reduces one by one; tied and untied embeddings);
//  - at dp 2 x tp 2 with sequence parallelism (4 ranks), where the norm gradients are final only
//    after sum_norm_grads: bitwise the one bucket after the backward;
//  - at dp 2, on the shape of scripts/configs/tiny.toml: the same equality, and the overlap
//    figures printed for the record (communication time, the part left exposed after the
//    backward, the share hidden; the machine's load makes them indicative only, and nothing is
//    asserted about time).
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/parallel/tp_plan.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::parallel {
namespace {

using test::g_world;

struct Layout {
  Mode mode;
  ReduceMode reduce;
  int zero;
};

std::string describe(const Layout& l, int64_t bucket_bytes) {
  return str_cat(mode_name(l.mode), " reduce ", reduce_mode_name(l.reduce), " zero ", l.zero, " buckets of ",
                 bucket_bytes, " bytes");
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 128;
  m.seq_len = 64;
  m.d_model = 64;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.tie_embeddings = false;  // the head reported on its own, wpe with wte
  return m;
}

ModelConfig tiny_toml_model() {  // scripts/configs/tiny.toml's [model]
  ModelConfig m;
  m.vocab_size = 512;
  m.seq_len = 256;
  m.d_model = 128;
  m.n_layers = 4;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  m.pos = PosKind::kRope;
  return m;
}

// What a run leaves to compare: every step's reduced gradient and norm, the final parameters.
struct StepsResult {
  std::vector<std::vector<float>> grads;
  std::vector<float> norms;
  std::vector<float> params;
  std::vector<OverlapStats> stats;
  double seconds = 0;
};

// Token t of global sequence s at step `step` (any deterministic spread of the vocabulary).
int32_t token(int64_t step, int64_t s, int64_t t, int64_t vocab) {
  return static_cast<int32_t>(xxh64(&t, sizeof t, static_cast<uint64_t>(step * 1000003 + s)) % static_cast<uint64_t>(vocab));
}

// Groups of a run: dp, and tp with or without sequence parallelism (none: tp = 1).
struct Groups {
  comm::Communicator& dp;
  comm::Communicator* tp = nullptr;
  bool sp = false;
};

// `steps` steps of a global batch of `seqs` sequences (micro-batches of one sequence), this dp
// rank's share; dp 1 runs the whole batch on a group of one.
StepsResult run(const ModelConfig& cfg, const Layout& l, Groups g, int64_t seqs, DpOptions options, int steps = 2) {
  // Ranks share the machine's cores: one compute thread each (the worker comes on top).
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  comm::SelfCommunicator alone("tp");
  comm::Communicator& tpc = g.tp ? *g.tp : alone;
  std::optional<CommTpGroup> tp_group;
  std::optional<TensorParallelPlan> tp_plan;
  if (g.tp) {
    tp_group.emplace(*g.tp);
    tp_plan.emplace(*tp_group, g.sp);
  }
  Model gpt(cfg, l.mode, 1, {.plan = tp_plan ? &*tp_plan : nullptr});
  gpt.init_parameters();  // tp: this rank's shards of the one model
  options.sequence_parallel = g.sp;
  DataParallel ddp(gpt, g.dp, tpc, *g_world, l.zero, l.reduce, AdamWConfig{}, options);
  const int64_t T = cfg.seq_len, B = seqs, BL = B / g.dp.size(), first = g.dp.rank() * BL;
  std::vector<int32_t> inputs(static_cast<size_t>(BL * T)), targets(inputs.size());
  StepsResult r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t s = 0; s < BL; ++s) {
      for (int64_t t = 0; t < T; ++t) {
        inputs[static_cast<size_t>(s * T + t)] = token(step, first + s, t, cfg.vocab_size);
        targets[static_cast<size_t>(s * T + t)] = token(step, first + s, t + 1, cfg.vocab_size);
      }
    }
    gpt.zero_grad();
    ChunkCombiner loss;
    gpt.forward_backward_batch(inputs.data(), targets.data(), BL, 1, first * T, 1.0f / static_cast<float>(B * T), loss);
    if (g.sp) ddp.sum_norm_grads_over_tp();
    ddp.reduce_gradients();
    if (ddp.grads_sharded()) {  // zero 2: the shard at its place, zeros elsewhere
      r.grads.emplace_back(static_cast<size_t>(gpt.num_params()), 0.0f);
      std::copy(ddp.grad_shard(), ddp.grad_shard() + (ddp.shard_end() - ddp.shard_first()),
                r.grads.back().begin() + ddp.shard_first());
    } else {
      r.grads.emplace_back(gpt.grads(), gpt.grads() + gpt.num_params());
    }
    r.stats.push_back(ddp.overlap_stats());
    r.norms.push_back(ddp.clip_grad_norm(1.0f));
    ddp.step(1e-3f, step + 1);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  r.params.assign(gpt.params(), gpt.params() + gpt.num_params());
  return r;
}

// Bitwise equality of a and b over [first, end) of every gradient, all the norms and parameters.
void expect_same(const StepsResult& a, const StepsResult& b, int64_t first, int64_t end, const std::string& what) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t s = 0; s < a.grads.size(); ++s) {
    for (int64_t i = first; i < end; ++i) {
      const auto k = static_cast<size_t>(i);
      ASSERT_EQ(std::memcmp(&a.grads[s][k], &b.grads[s][k], sizeof(float)), 0)
          << what << ": step " << s << " gradient element " << i << ": " << a.grads[s][k] << " vs " << b.grads[s][k];
    }
    ASSERT_EQ(std::memcmp(&a.norms[s], &b.norms[s], sizeof(float)), 0) << what << ": step " << s << " norm";
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  ASSERT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0)
      << what << ": parameters after the steps";
}

constexpr int64_t kOneBucket = int64_t{1} << 40;  // bigger than any model here
const DpOptions kAfterBackward{kOneBucket, false};  // the reduction before buckets

TEST(GradBucketsMpi, OverlappedBucketsGiveTheBitsOfOneBucketAfterTheBackward) {
  const ModelConfig cfg = small_model();
  const int p = g_world->size();
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (ReduceMode reduce : {ReduceMode::kExact, ReduceMode::kFast}) {
      for (int zero : {0, 1, 2}) {
        const Layout l{mode, reduce, zero};
        const StepsResult want = run(cfg, l, {*g_world}, 2 * p, kAfterBackward);
        // One chunk; four chunks (under every weight tensor: the smallest holds 4096 elements);
        // a few tensors; all.
        for (int64_t bytes : {int64_t{256}, int64_t{1} << 10, int64_t{128} << 10, kOneBucket}) {
          const StepsResult got = run(cfg, l, {*g_world}, 2 * p, {bytes, true});
          expect_same(got, want, 0, static_cast<int64_t>(want.params.size()), describe(l, bytes));
          ASSERT_GT(got.stats.back().transfers, bytes == kOneBucket ? 0 : 1) << describe(l, bytes);
        }
      }
    }
  }
}

TEST(GradBucketsMpi, CanonicalExactIsTheSingleProcessStep) {
  const int p = g_world->size();
  comm::SelfCommunicator alone("dp");
  // Two micro-batches per rank (zero 2 reduces each on its own); tied: wte's bucket stays open
  // from the head's backward to the embedding's.
  for (const auto& [zero, tied] : {std::pair{0, false}, {1, false}, {2, false}, {2, true}}) {
    ModelConfig cfg = small_model();
    cfg.tie_embeddings = tied;
    const Layout l{Mode::kCanonical, ReduceMode::kExact, zero};
    const StepsResult one = run(cfg, l, {alone}, 2 * p, {});
    const StepsResult dp = run(cfg, l, {*g_world}, 2 * p, {int64_t{16} << 10, true});
    // zero 2: each rank holds its shard of the gradient.
    const ShardPlan plan = make_shard_plan(Model(cfg, l.mode, 1).param_layout(), p);
    const int me = g_world->rank();
    expect_same(dp, one, zero == 2 ? plan.first(me) : 0, zero == 2 ? plan.end(me) : static_cast<int64_t>(one.params.size()),
                describe(l, int64_t{16} << 10) + (tied ? ", tied" : "") + " against one process");
  }
}

TEST(GradBucketsMpi, SequenceParallelNormBucketsWaitForTheTpSum) {
  if (g_world->size() != 4) GTEST_SKIP() << "dp 2 x tp 2 needs 4 ranks";
  ModelConfig cfg = small_model();  // every tp split on 64-element chunks, 64 tokens per tp rank
  cfg.d_model = 128;
  cfg.seq_len = 128;
  const int me = g_world->rank();
  auto tp = g_world->split(me / 2, me, "tp");
  auto dp = g_world->split(me % 2, me, "dp");
  for (const Layout l : {Layout{Mode::kCanonical, ReduceMode::kExact, 2}, Layout{Mode::kFast, ReduceMode::kFast, 1}}) {
    const StepsResult want = run(cfg, l, {*dp, tp.get(), true}, 4, kAfterBackward);
    for (int64_t bytes : {int64_t{1} << 10, DpOptions{}.bucket_bytes}) {
      const StepsResult got = run(cfg, l, {*dp, tp.get(), true}, 4, {bytes, true});
      expect_same(got, want, 0, static_cast<int64_t>(want.params.size()), describe(l, bytes) + ", dp 2 x tp 2 sp");
      ASSERT_GT(got.stats.back().transfers, 1) << "norm tensors are buckets of their own";
    }
  }
}

TEST(GradBucketsMpi, TinyTomlShapeAtDp2) {
  if (g_world->size() != 2) GTEST_SKIP() << "measured at dp 2 only";
  const ModelConfig cfg = tiny_toml_model();
  for (const Layout l : {Layout{Mode::kCanonical, ReduceMode::kExact, 1}, Layout{Mode::kFast, ReduceMode::kFast, 1}}) {
    const StepsResult want = run(cfg, l, {*g_world}, 8, kAfterBackward, 3);
    for (int64_t bytes : {DpOptions{}.bucket_bytes, int64_t{256} << 10}) {
      const StepsResult got = run(cfg, l, {*g_world}, 8, {bytes, true}, 3);
      expect_same(got, want, 0, static_cast<int64_t>(want.params.size()), describe(l, bytes));
      if (g_world->rank() != 0) continue;
      // The first step warms up; report the last.
      const OverlapStats& s = got.stats.back();
      std::printf("[ overlap  ] tiny.toml shape, dp 2, %s: %d buckets, step %.1f ms (one bucket after the "
                  "backward: %.1f ms), communication %.1f ms, exposed %.1f ms, hidden %.0f%%\n",
                  describe(l, bytes).c_str(), s.transfers, 1e3 * got.seconds, 1e3 * want.seconds, 1e3 * s.comm_s,
                  1e3 * s.exposed_s, 100 * s.hidden_share());
    }
  }
}

}  // namespace
}  // namespace lockstep::parallel
