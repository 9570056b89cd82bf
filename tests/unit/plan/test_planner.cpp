// The layout planner's cost model and search (src/plan/): the collectives' α–β times worked by
// hand, the measured all-reduce's interpolation and the ring fit, which link a group uses, compute
// time equal to the model's FLOPs at the GEMM rate on one GPU or to the measured passes, the
// pipeline's idle time the other stage's passes with free sends, memory that ZeRO and
// tensor parallelism divide as they should, context parallelism's share of the tokens and its
// gathers against the trainer's own byte count, communication exposed where it takes the compute's
// core, canonical mode's exact reductions, the profile's shapes and report, the solo group its cp
// passes are timed in, the search's order and rejections, and the cluster file's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "src/core/check.hpp"
#include "src/parallel/context_parallel.hpp"
#include "src/plan/collective_bench.hpp"
#include "src/plan/compute_profile.hpp"
#include "src/plan/goodput.hpp"
#include "src/plan/kernel_traffic.hpp"
#include "src/plan/local_cluster.hpp"
#include "src/plan/planner.hpp"
#include "src/plan/solo_communicator.hpp"

namespace lockstep::plan {
namespace {

Cluster cluster(int64_t gpus_per_node, int64_t nodes, double hbm_gib, double latency = 1e-5) {
  Cluster c;
  c.name = "test";
  c.source = "test.toml";
  c.gpus_per_node = gpus_per_node;
  c.nodes = nodes;
  c.hbm_bytes = hbm_gib * (1 << 30);
  c.reserved_bytes = 1 << 30;
  c.peak_fp32 = 20e12;
  c.peak_bf16 = 300e12;
  c.gemm_efficiency = 0.5;
  c.intra = {300e9, latency};
  c.inter = {25e9, 2 * latency};
  c.mtbf_gpu_hours = 50000;
  c.restart_s = 600;
  c.storage_write = 100e9;
  return c;
}

// A GPT of the library's defaults but these sizes.
ModelConfig gpt(int64_t vocab, int64_t seq_len, int64_t d_model, int64_t layers, int64_t heads, int64_t kv_heads) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.seq_len = seq_len;
  m.d_model = d_model;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  return m;
}

PlanRequest request(int64_t layers = 4, int64_t batch = 64) {
  const ModelConfig m = gpt(1024, 256, 512, layers, 8, 8);
  return {.model = describe_model(m), .global_batch = batch, .precision = Precision::kBf16, .source = "test model"};
}

// Long sequences, grouped-query attention (8 query heads, 4 of keys and values): the attention
// probabilities (T per head per token) dwarf the rest of a token's activations.
PlanRequest long_request(Mode mode = Mode::kFast, Precision precision = Precision::kBf16, int64_t T = 4096) {
  const ModelConfig m = gpt(1024, T, 512, 4, 8, 4);
  return {.model = describe_model(m), .global_batch = 16, .precision = precision, .mode = mode, .source = "long model"};
}

TEST(PlanCollectives, RingTimesByHand) {
  const Link l{100e9, 1e-5};
  // 8 ranks, 1 GB: 2·7 latencies and 2·7/8 of the buffer through the link.
  EXPECT_DOUBLE_EQ(all_reduce_time(1e9, 8, l), 14 * 1e-5 + 1.75e9 / 100e9);
  EXPECT_EQ(all_reduce_time(1e9, 1, l), 0);
  EXPECT_DOUBLE_EQ(send_time(1e9, l), 1e-5 + 1e-2);
}

TEST(PlanCollectives, MeasuredAllReduceInterpolatesBySize) {
  const Link l{1e9, 1e-5};
  const MeasuredAllReduce m{.fp32 = {{1e3, 2e-5}, {1e6, 4e-4}, {4e6, 1e-3}}, .ranks = 2};
  EXPECT_DOUBLE_EQ(all_reduce_time(10, 2, l, m), 2e-5);  // below the smallest: its time
  EXPECT_DOUBLE_EQ(all_reduce_time(1e6, 2, l, m), 4e-4);
  EXPECT_DOUBLE_EQ(all_reduce_time(2.5e6, 2, l, m), 7e-4);  // halfway between 1 and 4 MB
  // Beyond the largest: the rest at the link's bandwidth (2·1/2 of it through the link for 2 ranks).
  EXPECT_DOUBLE_EQ(all_reduce_time(5e6, 2, l, m), 1e-3 + 1e6 / 1e9);
  // Another group size: the α–β model.
  EXPECT_DOUBLE_EQ(all_reduce_time(1e6, 4, l, m), all_reduce_time(1e6, 4, l));
  // ZeRO-2's exact reduce-scatter: measured where it was, else two thirds of the exact all-reduce
  // (the doubles' share of its bytes).
  const MeasuredAllReduce exact{.exact = {{1e3, 3e-5}, {1e6, 9e-4}}, .ranks = 2};
  EXPECT_DOUBLE_EQ(exact_reduce_scatter_time(1e6, 2, l, exact, false), 6e-4);
  EXPECT_DOUBLE_EQ(exact_reduce_scatter_time(1e6, 2, l, exact, true), 6e-4);
  // Split evenly, or inside one rank's shard: that rank receives and adds all of it.
  MeasuredAllReduce scatter = exact;
  scatter.exact_scatter = {{1e3, 2.5e-5}, {1e6, 8e-4}};
  scatter.exact_scatter_owned = {{1e3, 2.6e-5}, {1e6, 1.2e-3}};
  EXPECT_DOUBLE_EQ(exact_reduce_scatter_time(1e6, 2, l, scatter, false), 8e-4);
  EXPECT_DOUBLE_EQ(exact_reduce_scatter_time(1e6, 2, l, scatter, true), 1.2e-3);
  EXPECT_DOUBLE_EQ(exact_reduce_scatter_time(1e6, 1, l, scatter, true), 0);
  // The all-gather: measured where it was (here a quarter of the all-reduce, as MPI's is on shared
  // memory), else the ring all-reduce's second half.
  MeasuredAllReduce gathered = m;
  EXPECT_DOUBLE_EQ(all_gather_time(1e6, 2, l, gathered), all_reduce_time(1e6, 2, l) / 2);
  gathered.gather = {{1e3, 5e-6}, {1e6, 1e-4}};
  EXPECT_DOUBLE_EQ(all_gather_time(1e6, 2, l, gathered), 1e-4);
  EXPECT_DOUBLE_EQ(all_gather_time(1e6, 4, l, gathered), all_reduce_time(1e6, 4, l) / 2);
  EXPECT_DOUBLE_EQ(all_gather_time(1e6, 1, l, gathered), 0);
  // ZeRO-3's layer gathers: as measured with the caches evicted where that was, else as the
  // all-gather (measured or not).
  EXPECT_DOUBLE_EQ(layer_gather_time(1e6, 2, l, gathered), 1e-4);
  EXPECT_DOUBLE_EQ(layer_gather_time(1e6, 2, l, m), all_reduce_time(1e6, 2, l) / 2);
  gathered.layer_gather = {{1e3, 2e-5}, {1e6, 4e-4}};
  EXPECT_DOUBLE_EQ(layer_gather_time(1e6, 2, l, gathered), 4e-4);
  EXPECT_DOUBLE_EQ(layer_gather_time(1e6, 4, l, gathered), all_reduce_time(1e6, 4, l) / 2);
  EXPECT_DOUBLE_EQ(layer_gather_time(1e6, 1, l, gathered), 0);
  EXPECT_DOUBLE_EQ(all_gather_time(1e6, 2, l, gathered), 1e-4);
}

TEST(PlanCollectives, RingFitRecoversLatencyAndBandwidth) {
  const Link truth{5e9, 3e-6};
  std::vector<CollectiveSample> samples;
  for (double bytes : {4e3, 6.4e4, 1e6, 1.6e7}) samples.push_back({bytes, all_reduce_time(bytes, 4, truth)});
  const Link fit = fit_ring_all_reduce(samples, 4);
  EXPECT_NEAR(fit.bandwidth, truth.bandwidth, 1e-6 * truth.bandwidth);
  EXPECT_NEAR(fit.latency, truth.latency, 1e-6 * truth.latency);
}

TEST(PlanCollectives, GroupsWithinANodeUseNvlink) {
  const Cluster c = cluster(8, 4, 80);
  EXPECT_EQ(&group_link(c, 1, 8), &c.intra);  // tp 8
  EXPECT_EQ(&group_link(c, 1, 4), &c.intra);
  EXPECT_EQ(&group_link(c, 4, 2), &c.intra);  // pp 2 over tp 4
  EXPECT_EQ(&group_link(c, 8, 2), &c.inter);  // pp 2 over tp 8: two nodes
  EXPECT_EQ(&group_link(c, 1, 16), &c.inter);
  EXPECT_EQ(&group_link(c, 1, 1), &c.intra);
}

TEST(PlanCostModel, OneGpuComputesTheModelsFlopsAtTheGemmRate) {
  const PlanRequest r = request();
  const Cluster c = cluster(1, 1, 80);
  Planner planner(r, c);
  const Layout l{.micro_batch = 4};
  ASSERT_TRUE(planner.problem(l).empty()) << planner.problem(l).text;
  const Prediction p = planner.predict(l);
  const double flops = flops_per_token(r.model) * 64 * 256;
  EXPECT_NEAR(p.time.compute, flops / (300e12 * 0.5), 1e-12 * p.time.compute);
  EXPECT_EQ(p.time.tp_comm, 0);
  EXPECT_EQ(p.time.pipeline, 0);
  EXPECT_EQ(p.time.dp_exposed, 0);
  EXPECT_DOUBLE_EQ(p.time.total, p.time.compute);
  EXPECT_NEAR(p.mfu, 0.5, 1e-12);
  EXPECT_EQ(p.micro_batches, 16);
  // Full recomputation runs every block's forward again: 1/3 of the blocks' FLOPs.
  const Prediction full = planner.predict({.micro_batch = 4, .recompute = Recompute::kFull});
  EXPECT_GT(full.time.recompute, 0);
  EXPECT_NEAR(full.time.compute, p.time.compute + full.time.recompute, 1e-12 * p.time.compute);
  EXPECT_LT(full.memory.activations, p.memory.activations);
  // Every FLOP runs at the GEMM rate, the recomputed ones too: the hardware FLOPs' utilization
  // stays the rate's, the model's falls by the recomputation's share of the time.
  EXPECT_DOUBLE_EQ(p.hfu, p.mfu);
  EXPECT_NEAR(full.hfu, 0.5, 1e-12);
  EXPECT_NEAR(full.mfu, 0.5 * p.time.compute / full.time.compute, 1e-12);
}

// The request()'s model (C 512, T 256, 8 heads, F 2048, vocabulary 1024, learned positions, GELU,
// LayerNorm, bf16) by kernel_traffic.hpp's rules, counted here by hand, per token: the embedding
// 4·C·3 forward and 4·C·5 backward; each attention sub-layer's norm (4 + 2)·C and (8 + 2)·C,
// residual add (8 + 2)·C and 12·C, softmax 8 and 12 bytes a score, 8·T scores; each MLP's norm and
// residual add, and GELU 2·(F + F) and 2·(2F + F); the final norm; the loss 8·V both ways.
constexpr double kBlockForwardBytes = 6 * 512 + 10 * 512 + 8 * 8 * 256 + 6 * 512 + 10 * 512 + 2 * 4096;
constexpr double kForwardBytes = 12 * 512 + 4 * kBlockForwardBytes + 6 * 512 + 8 * 1024;
constexpr double kBackwardBytes =
    20 * 512 + 4 * (10 * 512 + 12 * 512 + 12 * 8 * 256 + 10 * 512 + 12 * 512 + 2 * 6144) + 10 * 512 + 8 * 1024;

TEST(PlanCostModel, KernelsOtherThanGemmsStreamTheirBytesAtTheHbmRate) {
  const PlanRequest r = request();
  Cluster c = cluster(1, 1, 80);
  const Prediction gemms = Planner(r, c).predict({.micro_batch = 4});
  EXPECT_EQ(gemms.time.streaming, 0);  // no streaming rate: the GEMMs alone
  c.stream_bandwidth = 1e12;
  Planner planner(r, c);
  const Prediction p = planner.predict({.micro_batch = 4});
  const double tokens = 64 * 256;
  // Relative tolerances here are for sums of the same terms in another order, in double.
  EXPECT_NEAR(p.time.streaming, (kForwardBytes + kBackwardBytes) * tokens / 1e12, 1e-9 * p.time.streaming);
  EXPECT_NEAR(p.time.compute, gemms.time.compute + p.time.streaming, 1e-9 * p.time.compute);
  // The update: 36 bytes a parameter (the gradient zeroed and read for its norm, AdamW's 4 reads
  // and 3 writes, fp32) and the bf16 copy of each linear's weight.
  double params = 0, matmul = 0;
  for (const LayerDesc& l : r.model.layers) {
    for (const ParamDecl& d : l.params) {
      params += static_cast<double>(param_numel(d));
      if (d.matmul) matmul += static_cast<double>(param_numel(d));
    }
  }
  EXPECT_NEAR(p.time.optimizer, (36 * params + 2 * matmul) / 1e12, 1e-9 * p.time.optimizer);
  // Over 8 data-parallel ranks: ZeRO 1 updates an eighth of the parameters but zeroes and reads
  // every gradient; ZeRO 2 holds an eighth of the gradients too.
  Cluster eight = cluster(8, 1, 80);
  eight.stream_bandwidth = 1e12;
  Planner dp(r, eight);
  const double update = (28 * params + 2 * matmul) / 8;
  EXPECT_NEAR(dp.predict({.dp = 8, .micro_batch = 4, .zero = 1}).time.optimizer, (8 * params + update) / 1e12,
              1e-9 * p.time.optimizer);
  EXPECT_NEAR(dp.predict({.dp = 8, .micro_batch = 4, .zero = 2}).time.optimizer, (8 * params / 8 + update) / 1e12,
              1e-9 * p.time.optimizer);
  // The state-at-rest detector hashes the parameters and both moments (12 bytes a parameter)
  // twice; ZeRO 1 holds an eighth of the moments.
  EXPECT_NEAR(p.time.state_at_rest, 24 * params / 1e12, 1e-9 * p.time.state_at_rest);
  EXPECT_NEAR(dp.predict({.dp = 8, .micro_batch = 4, .zero = 1}).time.state_at_rest, 2 * (4 + 8.0 / 8) * params / 1e12,
              1e-9 * p.time.state_at_rest);
  EXPECT_NEAR(p.time.total, p.time.compute + p.time.optimizer + p.time.state_at_rest, 1e-9 * p.time.total);
  PlanRequest unchecked = r;
  unchecked.state_at_rest = false;
  EXPECT_EQ(Planner(unchecked, c).predict({.micro_batch = 4}).time.state_at_rest, 0);
  // Full recomputation streams every block's forward bytes again.
  const Prediction full = planner.predict({.micro_batch = 4, .recompute = Recompute::kFull});
  EXPECT_NEAR(full.time.streaming - p.time.streaming, 4 * kBlockForwardBytes * tokens / 1e12, 1e-9 * p.time.streaming);
  // Two tensor-parallel ranks split the heads' scores and the hidden features; sequence
  // parallelism splits the stream's norms and residual adds too.
  const LayerDesc& attention = r.model.layers[1];
  ASSERT_EQ(attention.kind, LayerKind::kAttention);
  const Traffic one = layer_traffic(attention, 1, false, Precision::kBf16);
  const Traffic tp = layer_traffic(attention, 2, false, Precision::kBf16);
  const Traffic sp = layer_traffic(attention, 2, true, Precision::kBf16);
  EXPECT_DOUBLE_EQ(one.forward, 6 * 512 + 10 * 512 + 8 * 8 * 256);
  EXPECT_DOUBLE_EQ(tp.forward, 6 * 512 + 10 * 512 + 8 * 4 * 256);
  EXPECT_DOUBLE_EQ(sp.forward, (6 * 512 + 10 * 512) / 2 + 8 * 4 * 256);
  EXPECT_DOUBLE_EQ(layer_traffic(attention, 1, false, Precision::kF32).forward, 8 * 512 + 12 * 512 + 8 * 8 * 256);
}

TEST(PlanCostModel, OneFOneBIdlesForTheOtherStagesPassWhenSendsAreFree) {
  const PlanRequest r = request(8, 32);
  Cluster c = cluster(8, 1, 80, 0);
  c.intra.bandwidth = c.inter.bandwidth = 1e30;
  Planner planner(r, c);
  const Layout l{.dp = 4, .pp = 2, .micro_batch = 2};
  ASSERT_TRUE(planner.problem(l).empty()) << planner.problem(l).text;
  const Prediction p = planner.predict(l);
  ASSERT_EQ(p.micro_batches, 4);
  // Two stages, each timed with its own passes: the busiest rank's m passes plus the other's one
  // forward (the fill) and one backward (the drain) — at most (p − 1)/m of the busy time, as when
  // every stage ran at the busiest's pace, and at least half of that for stages balanced by FLOPs.
  const double uniform = (p.time.compute + p.time.tp_comm) / 4;
  EXPECT_LE(p.time.pipeline, uniform * (1 + 1e-12));
  EXPECT_GT(p.time.pipeline, uniform / 2);
}

// A mixture of experts: compute is the active FLOPs (top_k of the experts a token), memory every
// expert's parameters, and tensor parallelism all-reduces each choice's rows (top_k a token).
TEST(PlanCostModel, MixtureOfExpertsComputesTheActiveFlopsAndHoldsEveryExpert) {
  PlanRequest dense = request();
  ModelConfig m = dense.model.config;
  m.moe_experts = 8;
  m.moe_top_k = 2;
  const PlanRequest moe{.model = describe_model(m), .global_batch = 64, .precision = Precision::kBf16,
                        .source = "test moe"};
  const Cluster c = cluster(8, 1, 80);
  Planner planner(moe, c), dense_planner(dense, c);
  const Layout one{.dp = 8, .micro_batch = 4};
  ASSERT_TRUE(planner.problem(one).empty()) << planner.problem(one).text;
  const Prediction p = planner.predict(one), d = dense_planner.predict(one);
  const double tokens = 64.0 / 8 * 256;
  EXPECT_NEAR(p.time.compute, flops_per_token(moe.model) * tokens / (300e12 * 0.5), 1e-12 * p.time.compute);
  // Eight experts of the dense MLP's width: about four times the parameters of the dense model
  // (its MLPs are two thirds of them), two experts' FLOPs a token.
  EXPECT_GT(p.memory.params, 3 * d.memory.params);
  EXPECT_GT(flops_per_token(moe.model), flops_per_token(dense.model));
  const Prediction tp8 = planner.predict({.tp = 8, .micro_batch = 4}), dense_tp8 = dense_planner.predict({.tp = 8, .micro_batch = 4});
  EXPECT_GT(tp8.time.tp_comm, dense_tp8.time.tp_comm);
  const Prediction full = planner.predict({.dp = 8, .micro_batch = 4, .recompute = Recompute::kFull});
  EXPECT_LT(full.memory.activations, p.memory.activations);
  EXPECT_GT(full.time.recompute, 0);
  // Expert parallelism: ep 4 of the 8 data ranks holds a quarter of the experts and pays for the
  // rows' exchanges; ep must divide the experts; a dense model has no ep to search.
  const Layout ep4{.dp = 2, .ep = 4, .micro_batch = 4};
  ASSERT_TRUE(planner.problem(ep4).empty()) << planner.problem(ep4).text;
  const Prediction e = planner.predict(ep4);
  EXPECT_LT(e.memory.params, p.memory.params / 2);
  EXPECT_GT(e.time.ep_comm, 0);
  EXPECT_EQ(p.time.ep_comm, 0);
  EXPECT_NEAR(e.time.compute, p.time.compute, 1e-12 * p.time.compute);  // the same tokens a rank
  EXPECT_EQ(planner.problem({.dp = 8, .ep = 3, .micro_batch = 4}).kind, "gpus");
  EXPECT_EQ(planner.problem({.dp = 1, .tp = 1, .ep = 8, .micro_batch = 4}).kind, "");
  const Cluster twelve = cluster(4, 3, 80);
  Planner on_twelve(moe, twelve);
  EXPECT_EQ(on_twelve.problem({.dp = 4, .ep = 3, .micro_batch = 1}).kind, "ep");
  EXPECT_EQ(dense_planner.problem({.dp = 4, .ep = 2, .micro_batch = 4}).kind, "ep");
  // The search tries ep (1, 2, 4, 8 here); a dense model's none.
  const SearchResult s = planner.search();
  EXPECT_TRUE(std::any_of(s.ranked.begin(), s.ranked.end(), [](const Prediction& x) { return x.layout.ep == 8; }));
  const SearchResult sd = dense_planner.search();
  EXPECT_TRUE(std::none_of(sd.ranked.begin(), sd.ranked.end(), [](const Prediction& x) { return x.layout.ep > 1; }));
}

// An unbalanced router: the busiest expert-parallel rank computes, streams and receives moe_load
// times its share of the routed rows, and the step waits for it; without ep every rank runs every
// expert.
TEST(PlanCostModel, TheBusiestExpertParallelRankSetsTheStep) {
  ModelConfig m = request().model.config;
  m.moe_experts = 8;
  m.moe_top_k = 2;
  PlanRequest balanced{.model = describe_model(m), .global_batch = 64, .precision = Precision::kBf16, .source = "moe"};
  PlanRequest loaded = balanced;
  loaded.moe_load = 1.5;
  Cluster c = cluster(8, 1, 80);
  const Layout ep4{.dp = 2, .ep = 4, .micro_batch = 4};
  const Prediction e = Planner(balanced, c).predict(ep4), s = Planner(loaded, c).predict(ep4);
  // Four MoE layers, each token's two choices through an expert of C = 512 and F = 2048 (two
  // matrices, 6 FLOPs a weight): half of that again on the busiest rank.
  const double routed = 4 * 2 * 6.0 * 2 * 512 * 2048;
  const double tokens = 64.0 / 8 * 256;  // a rank's tokens a step
  // Relative tolerances here are for sums of the same terms in another order, in double.
  EXPECT_NEAR(s.time.compute - e.time.compute, 0.5 * routed * tokens / (300e12 * 0.5), 1e-9 * e.time.compute);
  // Each exchange moves 1.5 times the rows a rank sends on average: 1024 tokens a micro-batch, two
  // choices each, 512 bf16 features.
  const Link& link = group_link(c, 1, 4);
  const double rows = 1024.0 * 2 * 512 * 2;
  EXPECT_NEAR(s.time.ep_comm, e.time.ep_comm * all_to_all_time(1.5 * rows, 4, link) / all_to_all_time(rows, 4, link),
              1e-9 * s.time.ep_comm);
  EXPECT_GT(s.memory.activations, e.memory.activations);  // the rows it receives and runs
  // At a streaming rate, the busiest rank's routed rows also stream through their copies and the
  // experts' GELU: per choice 4·2·C copied in each pass (to the expert and back, the forward's rows
  // and the backward's gradients), 2·(F + F) forward and 2·(2F + F) backward.
  c.stream_bandwidth = 1e12;
  const Prediction es = Planner(balanced, c).predict(ep4), ss = Planner(loaded, c).predict(ep4);
  const double routed_bytes = 4 * 2 * (2 * 4 * 2 * 512 + 2 * 4096 + 2 * 6144);
  EXPECT_NEAR(ss.time.compute - es.time.compute,
              0.5 * routed * tokens / (300e12 * 0.5) + 0.5 * routed_bytes * tokens / 1e12, 1e-9 * es.time.compute);
  const Layout dp8{.dp = 8, .micro_batch = 4};
  EXPECT_DOUBLE_EQ(Planner(loaded, c).predict(dp8).time.total, Planner(balanced, c).predict(dp8).time.total);
}

TEST(PlanCostModel, ZeroAndTensorParallelismDivideWhatTheyShard) {
  const PlanRequest r = request();
  const Cluster c = cluster(8, 1, 80);
  Planner planner(r, c);
  const Prediction z0 = planner.predict({.dp = 8, .micro_batch = 2});
  const Prediction z1 = planner.predict({.dp = 8, .micro_batch = 2, .zero = 1});
  const Prediction z2 = planner.predict({.dp = 8, .micro_batch = 2, .zero = 2});
  EXPECT_NEAR(z1.memory.optimizer, z0.memory.optimizer / 8, 1e-9 * z0.memory.optimizer);
  EXPECT_EQ(z1.memory.grads, z0.memory.grads);
  // Zero 0: the gradients, the reduced shard kept apart, and fast mode's exact reduction receiving
  // every rank's part of one bucket (25 MiB, the trainer's default); zero 2: the shard, the staging
  // of one bucket, the same receiving and a part's buffer.
  const double bucket = 25 << 20, fp32 = z0.memory.optimizer / 2;  // AdamW's 8 bytes a parameter
  ASSERT_GT(fp32, bucket);
  EXPECT_DOUBLE_EQ(z0.memory.grads, fp32 + fp32 / 8 + bucket);
  EXPECT_DOUBLE_EQ(z2.memory.grads, fp32 / 8 + bucket + bucket + bucket / 8);
  EXPECT_EQ(z2.memory.params, z0.memory.params);
  // Canonical mode reducing in fp32 ([parallel] reduce = "fast"): its shard of exact sums (13
  // bytes a parameter), the staging, a part's buffer and the bucket's exact sums rounded into one.
  PlanRequest rounded = r;
  rounded.mode = Mode::kCanonical;
  rounded.exact_reduce = false;
  const Prediction canonical_z2 = Planner(rounded, c).predict({.dp = 8, .micro_batch = 2, .zero = 2});
  EXPECT_DOUBLE_EQ(canonical_z2.memory.grads, fp32 / 4 * 13 / 8 + bucket + bucket / 8 + bucket);
  // Zero 1 adds the parameters' all-gather; zero 2 reduces in every micro-batch.
  EXPECT_GT(z1.time.dp_exposed, z0.time.dp_exposed);
  const Prediction tp8 = planner.predict({.tp = 8, .micro_batch = 2});
  const Prediction tp8sp = planner.predict({.tp = 8, .micro_batch = 2, .sp = true});
  EXPECT_LT(tp8.memory.params, z0.memory.params / 4);  // matrices split, norms and biases not
  EXPECT_GT(tp8.time.tp_comm, 0);
  EXPECT_DOUBLE_EQ(tp8sp.time.tp_comm, tp8.time.tp_comm);  // the same bytes
  EXPECT_LT(tp8sp.memory.activations, tp8.memory.activations);
}

// Context parallelism: a rank computes, reduces over tp and keeps the activations of its T / cp
// positions, plus every position's q, k and v as its attention op gathers them (fp32:
// context_parallel.cpp's all_, recv_, send_ and summed_, and the keys' gradients' partial sums or
// exact sums); it gathers k and v in the forward and again in the backward, where it also reduces
// their gradients — the trainer's own least count of bytes (cp_min_bytes) at the link's bandwidth,
// 4/3 of it in fast mode (an fp32 all-reduce is twice a gather), 5/3 in canonical (the exact one is
// 1.5 times the fp32). Free latencies make every time proportional to its bytes.
TEST(PlanCostModel, ContextParallelismSplitsTheSequence) {
  const PlanRequest r = long_request();
  const ModelConfig& cfg = r.model.config;
  const Cluster c = cluster(8, 1, 80, 0);
  Planner planner(r, c);
  const Prediction one = planner.predict({.micro_batch = 2}), cp4 = planner.predict({.cp = 4, .micro_batch = 2});
  ASSERT_EQ(cp4.micro_batches, one.micro_batches);  // the cp ranks share the sequences
  EXPECT_NEAR(cp4.time.compute, one.time.compute / 4, 1e-12 * one.time.compute);
  EXPECT_EQ(one.time.cp_comm, 0);
  const auto seconds = [&](double bytes, const Link& l) { return bytes / l.bandwidth; };
  const auto least = [&](int64_t cp, int64_t tp) {
    return static_cast<double>(parallel::cp_min_bytes(cfg, cp, tp, r.global_batch, cfg.n_layers));
  };
  EXPECT_NEAR(cp4.time.cp_comm, 4.0 / 3 * seconds(least(4, 1), c.intra), 1e-12 * cp4.time.cp_comm);
  // Selective recomputation runs the attention's forward, and its gather, again: a fourth more.
  const Prediction again = planner.predict({.cp = 4, .micro_batch = 2, .recompute = Recompute::kSelective});
  EXPECT_NEAR(again.time.cp_comm, cp4.time.cp_comm * 5 / 4, 1e-12 * cp4.time.cp_comm);
  // cp's ranks follow tp's: tp 4 x cp 2 fits the node of 8, tp 8 x cp 2 reaches the next node.
  const Prediction tp4 = planner.predict({.tp = 4, .cp = 2, .micro_batch = 2});
  const Prediction tp8 = planner.predict({.tp = 8, .cp = 2, .micro_batch = 2});
  EXPECT_NEAR(tp4.time.cp_comm, 4.0 / 3 * seconds(least(2, 4), c.intra), 1e-12 * tp4.time.cp_comm);
  EXPECT_NEAR(tp8.time.cp_comm, 4.0 / 3 * seconds(least(2, 8), c.inter), 1e-12 * tp8.time.cp_comm);
  // The tensor-parallel all-reduces carry a rank's tokens.
  const Prediction tp2 = planner.predict({.tp = 2, .micro_batch = 2});
  const Prediction tp2_cp4 = planner.predict({.tp = 2, .cp = 4, .micro_batch = 2});
  EXPECT_NEAR(tp2_cp4.time.tp_comm, tp2.time.tp_comm / 4, 1e-12 * tp2.time.tp_comm);

  // Activations: a quarter of the tokens' (the probabilities (mb, NH, T/4, T)), and the gathers'
  // buffers per position of the micro-batch's sequences, one set that every attention layer uses.
  const auto T = static_cast<double>(cfg.seq_len), qkv = static_cast<double>(cfg.qkv_width());
  const auto kv = static_cast<double>(2 * cfg.n_kv_heads * cfg.head_size());
  const double positions = 2 * T;
  const double gathered = 4 * (qkv + 2 * kv + kv / 4);
  EXPECT_NEAR(cp4.memory.activations, one.memory.activations / 4 + positions * (gathered + 4 * kv),
              1e-12 * one.memory.activations);
  EXPECT_LT(cp4.memory.activations, one.memory.activations / 2);
  EXPECT_EQ(cp4.memory.params, one.memory.params);

  PlanRequest exact = r;
  exact.mode = Mode::kCanonical;
  Planner canonical(exact, c);
  const Prediction e = canonical.predict({.cp = 4, .micro_batch = 2});
  EXPECT_NEAR(e.time.cp_comm, 5.0 / 3 * seconds(least(4, 1), c.intra), 1e-12 * e.time.cp_comm);
  // The exact sums (a double and a flag) and this rank's shard of them, and one layer's exact
  // reduce-scatter: every rank's doubles of the shard, and their exact sum.
  const double held = gathered + 9 * kv + 4 * kv / 4, reduce = 8 * kv + 9 * kv / 4;
  EXPECT_NEAR(e.memory.activations, one.memory.activations / 4 + (held + reduce) * positions,
              1e-12 * one.memory.activations);
}

// The ring (p2p): no probabilities kept and no (tokens, T) workspace, the ring's own buffers
// instead; the same bytes sent; the recomputed products (canonical: two forward, three backward of
// attention's six a token; fast: one and three) at the GEMM rate. Its layout text round-trips.
TEST(PlanCostModel, TheRingKeepsNoProbabilitiesAndRecomputesTheScores) {
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    PlanRequest r = long_request(mode);
    const ModelConfig& cfg = r.model.config;
    const Cluster c = cluster(8, 1, 80, 0);
    Planner planner(r, c);
    const Layout gather{.cp = 4, .micro_batch = 2}, ring{.cp = 4, .ring = true, .micro_batch = 2};
    const Prediction g = planner.predict(gather), p = planner.predict(ring);
    EXPECT_EQ(p.time.cp_comm, g.time.cp_comm);
    const auto T = static_cast<double>(cfg.seq_len), C = static_cast<double>(cfg.d_model);
    const double tokens = 2 * T / 4, layers = static_cast<double>(cfg.n_layers);
    const double product = 2 * C * T;  // one of the six: 12·C·T a token
    const double rate = c.gemm_flops(Precision::kBf16);
    const bool exact = mode == Mode::kCanonical;
    const double extra = (exact ? 5 : 4) * product * tokens * layers / rate * static_cast<double>(g.micro_batches);
    EXPECT_NEAR(p.time.compute - g.time.compute, extra, 1e-9 * extra);
    // Memory: nothing (T, T)-shaped, so linear in T, where the all-gather's grows faster; and less
    // by at least the kept probabilities (NH·T a token, bf16) beyond the ring's max and Z (2·NH).
    Planner longer(long_request(mode, Precision::kBf16, 2 * cfg.seq_len), c);
    EXPECT_NEAR(longer.predict(ring).memory.activations, 2 * p.memory.activations, 1e-9 * p.memory.activations);
    EXPECT_GT(longer.predict(gather).memory.activations, 3 * g.memory.activations);
    const double NH = static_cast<double>(cfg.n_heads);
    EXPECT_GE(g.memory.activations - p.memory.activations, layers * tokens * (NH * T - 2 * NH) * 2);
  }
  EXPECT_EQ(parse_layout("dp2 tp1 pp1 cp4 p2p mb1 zero1", "test").text(), "dp2 tp1 pp1 cp4 p2p mb1 zero1");
}

// The cp ranks hold the same parameters: the gradients are reduced, and ZeRO shards them, over
// dp × cp — as over as many data-parallel ranks (zero 2's reduce-scatter runs in each of dp 2's
// four micro-batches, dp 8's one).
TEST(PlanCostModel, ContextParallelReplicasShareTheGradients) {
  const PlanRequest r = long_request();
  Cluster c = cluster(8, 1, 80);
  c.comm_beside_compute = false;  // every reduction exposed: the same bytes, the same time
  Planner planner(r, c);
  for (int zero = 0; zero <= 2; ++zero) {
    const Prediction dp8 = planner.predict({.dp = 8, .micro_batch = 2, .zero = zero});
    const Prediction dp2_cp4 = planner.predict({.dp = 2, .cp = 4, .micro_batch = 2, .zero = zero});
    EXPECT_EQ(dp2_cp4.memory.optimizer, dp8.memory.optimizer) << zero;
    EXPECT_EQ(dp2_cp4.memory.grads, dp8.memory.grads) << zero;
    if (zero < 2) {
      EXPECT_NEAR(dp2_cp4.time.dp_exposed, dp8.time.dp_exposed, 1e-12 * dp8.time.dp_exposed) << zero;
    }
  }
  const Prediction cp8 = planner.predict({.cp = 8, .micro_batch = 2, .zero = 1});
  EXPECT_GT(cp8.time.dp_exposed, 0);
  EXPECT_EQ(cp8.memory.optimizer, planner.predict({.dp = 8, .micro_batch = 2, .zero = 1}).memory.optimizer);
}

TEST(PlanCostModel, ContextParallelismRunsWhereTheTrainerRunsIt) {
  const Cluster c = cluster(8, 8, 80);  // 64 GPUs
  Planner planner(long_request(), c);
  EXPECT_EQ(planner.problem({.dp = 8, .cp = 8}).kind, "");
  EXPECT_EQ(planner.problem({.dp = 8, .cp = 4}).kind, "gpus");
  const auto refused = [](Planner& p, const Layout& l, const std::string& why) {
    const Problem problem = p.problem(l);
    EXPECT_EQ(problem.kind, "cp") << l.text();
    EXPECT_NE(problem.text.find(why), std::string::npos) << problem.text;
  };
  // 4096 positions are not 2 x 64 blocks of whole 64-position chunks.
  refused(planner, {.cp = 64}, "seq_len (4096) to be a multiple of 2 x cp x 64 = 8192");
  refused(planner, {.dp = 4, .pp = 2, .cp = 8}, "pipeline parallelism");
  Cluster fp8 = c;
  fp8.peak_fp8 = 600e12;
  Planner fp8_planner(long_request(Mode::kFast, Precision::kFp8), fp8);
  refused(fp8_planner, {.dp = 8, .cp = 8}, "fp8 linears");
  PlanRequest moe = long_request();
  ModelConfig m = moe.model.config;
  m.moe_experts = 8;
  moe.model = describe_model(m);
  Planner moe_planner(moe, c);
  EXPECT_EQ(moe_planner.problem({.dp = 4, .cp = 8, .ep = 2}).kind, "");  // MoE layers run under cp, with ep too
  EXPECT_GT(moe_planner.predict({.dp = 4, .cp = 8, .ep = 2}).time.cp_comm, 0);
}

// A profile with every pass of a shape at the given seconds (no recomputation: as given; with
// one, the backward longer by `recompute`).
ComputeProfile profile(int64_t tp, bool sp, int64_t mb, PassTimes t, double recompute) {
  ComputeProfile p;
  p.set({tp, sp, mb, Recompute::kNone}, t);
  p.set({tp, sp, mb, Recompute::kSelective}, {t.forward, t.backward + recompute / 2, t.optimizer});
  p.set({tp, sp, mb, Recompute::kFull}, {t.forward, t.backward + recompute, t.optimizer});
  return p;
}

TEST(PlanCostModel, MeasuredPassesReplaceTheGemmRate) {
  const PlanRequest r = request();  // 64 sequences
  const ComputeProfile measured = profile(1, false, 4, {0.01, 0.02, 0.003}, 0.005);
  Planner one(r, cluster(1, 1, 80), &measured);
  const Prediction p = one.predict({.micro_batch = 4});
  ASSERT_EQ(p.micro_batches, 16);
  EXPECT_NEAR(p.time.compute, 16 * 0.03, 1e-12);
  EXPECT_DOUBLE_EQ(p.time.optimizer, 0.003);
  EXPECT_NEAR(p.time.total, 16 * 0.03 + 0.003, 1e-12);
  const Prediction full = one.predict({.micro_batch = 4, .recompute = Recompute::kFull});
  EXPECT_NEAR(full.time.recompute, 16 * 0.005, 1e-12);
  EXPECT_NEAR(full.time.compute, 16 * 0.035, 1e-12);
  // Two stages: the busiest holds more than half of the FLOPs and less than all; ZeRO 1 over two
  // replicas updates half of the parameters.
  Planner two(r, cluster(2, 1, 80), &measured);
  const Prediction pp2 = two.predict({.pp = 2, .micro_batch = 4});
  EXPECT_GT(pp2.time.compute, 16 * 0.015);
  EXPECT_LT(pp2.time.compute, 16 * 0.03);
  // The recomputation by the busiest rank's share of the 4 recomputed blocks (a whole number of
  // them), not of all FLOPs: the head on the last stage is never recomputed.
  const double blocks = two.predict({.pp = 2, .micro_batch = 4, .recompute = Recompute::kFull}).time.recompute /
                        (16 * 0.005) * 4;
  EXPECT_NEAR(blocks, std::round(blocks), 1e-9);
  EXPECT_GE(blocks, 1);
  EXPECT_LE(blocks, 3);
  const Prediction z1 = two.predict({.dp = 2, .micro_batch = 4, .zero = 1});
  EXPECT_NEAR(z1.time.optimizer, 0.003 / 2, 1e-15);
  // A cp rank's passes, timed as it computes them (its blocks of every sequence, the attention
  // against all keys, its exact sums of their gradients), are taken as they are: not one rank's
  // whole sequences divided by cp, which is what the passes of cp 1 would give (0.015 s).
  ComputeProfile with_cp = measured;
  with_cp.set({1, false, 4, Recompute::kNone, 2}, {0.007, 0.016, 0.003});
  Planner cp_planner(r, cluster(2, 1, 80), &with_cp);
  const Prediction cp2 = cp_planner.predict({.cp = 2, .micro_batch = 4});
  ASSERT_EQ(cp2.micro_batches, 16);
  EXPECT_NEAR(cp2.time.compute, 16 * 0.023, 1e-12);
  EXPECT_GT(cp2.time.cp_comm, 0);
  // The ring's passes are its own shape's, with its recomputed products in them: nothing added.
  EXPECT_THROW(cp_planner.predict({.cp = 2, .ring = true, .micro_batch = 4}), InternalError);
  with_cp.set({1, false, 4, Recompute::kNone, 2, true}, {0.011, 0.021, 0.004});
  Planner ring_planner(r, cluster(2, 1, 80), &with_cp);
  const Prediction ring = ring_planner.predict({.cp = 2, .ring = true, .micro_batch = 4});
  EXPECT_NEAR(ring.time.compute, 16 * 0.032, 1e-12);
  EXPECT_NEAR(ring.time.optimizer, 0.004, 1e-15);
  EXPECT_NEAR(ring_planner.predict({.cp = 2, .micro_batch = 4}).time.compute, 16 * 0.023, 1e-12);
}

// The trainer's step includes the state-at-rest detector's hashes: measured for a rank's
// parameters and moments whole, and scaled to what the layout has it hold.
TEST(PlanCostModel, TheStepHashesTheStateAtRestItHolds) {
  const PlanRequest r = request();
  ComputeProfile measured = profile(1, false, 4, {0.01, 0.02, 0.003}, 0.005);
  measured.set({1, false, 4, Recompute::kNone}, {0.01, 0.02, 0.003, 0, 0, 0.0006});
  Planner one(r, cluster(1, 1, 80), &measured);
  const Prediction p = one.predict({.micro_batch = 4});
  EXPECT_DOUBLE_EQ(p.time.state_at_rest, 0.0006);
  EXPECT_NEAR(p.time.total, 16 * 0.03 + 0.003 + 0.0006, 1e-12);
  // Full recomputation holds the same state.
  EXPECT_DOUBLE_EQ(one.predict({.micro_batch = 4, .recompute = Recompute::kFull}).time.state_at_rest, 0.0006);
  Planner two(r, cluster(2, 1, 80), &measured);
  // Two replicas: ZeRO 0 holds it all, ZeRO 1 and 2 half of the moments, ZeRO 3 half of everything.
  EXPECT_DOUBLE_EQ(two.predict({.dp = 2, .micro_batch = 4}).time.state_at_rest, 0.0006);
  for (int zero : {1, 2}) {
    EXPECT_NEAR(two.predict({.dp = 2, .micro_batch = 4, .zero = zero}).time.state_at_rest, 0.0006 * 2 / 3, 1e-15);
  }
  EXPECT_NEAR(two.predict({.dp = 2, .micro_batch = 4, .zero = 3}).time.state_at_rest, 0.0003, 1e-15);
  // Two stages: the rank with more of the parameters.
  const Prediction pp2 = two.predict({.pp = 2, .micro_batch = 4});
  EXPECT_GT(pp2.time.state_at_rest, 0.0003);
  EXPECT_LT(pp2.time.state_at_rest, 0.0006);
}

TEST(PlanCostModel, ZeroBubbleTakesTheMeasuredSplitAndTheTiedEmbeddingsWait) {
  // One micro-batch a step through two stages. Measured, the split backward's two passes take
  // longer than the backward in one (0.0215 against 0.02 s).
  const ComputeProfile measured = profile(1, false, 4, {0.01, 0.02, 0.003, 0.012, 0.0095}, 0.005);
  const Layout one_f_one_b{.pp = 2, .micro_batch = 4};
  Layout zb = one_f_one_b;
  zb.schedule = parallel::ScheduleKind::kZeroBubble;
  PlanRequest tied = request(4, 4), untied = tied;
  ModelConfig m = untied.model.config;
  m.tie_embeddings = false;
  untied.model = describe_model(m);
  ASSERT_TRUE(tied.model.layers.back().tied);
  for (const PlanRequest& r : {tied, untied}) {
    Planner two(r, cluster(2, 1, 80), &measured);
    const double zb_step = two.predict(zb).time.total, one_f_one_b_step = two.predict(one_f_one_b).time.total;
    if (r.model.layers.back().tied) {
      // The first rank's Bi waits for the last rank's W and the head's gradient of wte: no
      // overlap is left, and the split's extra time shows.
      EXPECT_GT(zb_step, one_f_one_b_step);
    } else {
      EXPECT_LT(zb_step, one_f_one_b_step);  // the last rank's W beside the first rank's Bi
    }
  }
}

TEST(PlanCostModel, ZeroThreeShardsTheParametersAndGathersEachLayer) {
  const PlanRequest r = request();
  const Cluster c = cluster(8, 1, 80);
  Planner planner(r, c);
  const Prediction z2 = planner.predict({.dp = 8, .micro_batch = 2, .zero = 2});
  const Prediction z3 = planner.predict({.dp = 8, .micro_batch = 2, .zero = 3});
  // The shard of the fp32 parameters (an eighth of N; AdamW's state over dp 8 is 8 N / 8 bytes),
  // its bf16 rounding that the gathers send, and two fp32 windows of the largest layer's (a tied
  // head reads wte), no bf16 copy.
  double largest = 0;
  for (const LayerDesc& l : r.model.layers) {
    double n = l.kind == LayerKind::kHead && l.tied ? static_cast<double>(l.dims.V * l.dims.C) : 0;
    for (const ParamDecl& p : l.params) n += static_cast<double>(param_numel(p));
    largest = std::max(largest, n);
  }
  const double N = z2.memory.optimizer;
  EXPECT_DOUBLE_EQ(z3.memory.params, (4 + 2) * N / 8 + 2 * 4 * largest);
  EXPECT_LT(z3.memory.params, z2.memory.params / 2);
  EXPECT_EQ(z3.memory.grads, z2.memory.grads);
  EXPECT_EQ(z3.memory.optimizer, z2.memory.optimizer);
  // Per-layer gathers in every micro-batch instead of one all-gather after the update: at least
  // the first layer's gather is exposed, and a slow network exposes more than zero 2's all-gather.
  EXPECT_GT(z3.time.dp_exposed, 0);
  Cluster slow = c;
  slow.intra.bandwidth /= 1000;
  Planner slow_planner(r, slow);
  const Prediction s2 = slow_planner.predict({.dp = 8, .micro_batch = 2, .zero = 2});
  const Prediction s3 = slow_planner.predict({.dp = 8, .micro_batch = 2, .zero = 3});
  EXPECT_GT(s3.time.dp_exposed, s2.time.dp_exposed);
  // What the trainer refuses with zero 3.
  EXPECT_EQ(planner.problem({.dp = 4, .pp = 2, .micro_batch = 2, .zero = 3}).kind, "zero");
}

TEST(PlanCostModel, CommunicationOnTheComputesCoreIsNotHidden) {
  PlanRequest r = request();
  r.bucket_bytes = 1 << 20;
  const ComputeProfile measured = profile(1, false, 4, {0.01, 0.02, 0}, 0);
  Cluster c = cluster(2, 1, 80);
  Planner beside(r, c, &measured);
  c.comm_beside_compute = false;
  Planner on_core(r, c, &measured);
  const Layout dp2{.dp = 2, .micro_batch = 4};
  const Prediction hidden = beside.predict(dp2), exposed = on_core.predict(dp2);
  // Every 1 MiB bucket's all-reduce one after the other, none behind the backward.
  const double grads = exposed.memory.optimizer / 2;  // fp32, as AdamW's 8 bytes a parameter are
  const double buckets = std::floor(grads / (1 << 20)), rest = grads - buckets * (1 << 20);
  const double sync = buckets * all_reduce_time(1 << 20, 2, c.intra) + all_reduce_time(rest, 2, c.intra);
  EXPECT_NEAR(exposed.time.dp_exposed, sync, 1e-12);
  EXPECT_NEAR(hidden.time.dp_exposed, std::max(sync - 0.02, all_reduce_time(1 << 20, 2, c.intra)), 1e-12);
  EXPECT_LT(hidden.time.dp_exposed, exposed.time.dp_exposed);
}

TEST(PlanCostModel, CanonicalModeReducesExactly) {
  PlanRequest r = request();
  const ComputeProfile measured = profile(2, false, 4, {0.01, 0.02, 0}, 0);
  Cluster c = cluster(2, 1, 80);
  c.measured = {.fp32 = {{1e3, 1e-5}, {1e8, 1e-2}}, .exact = {{1e3, 3e-5}, {1e8, 5e-2}}, .ranks = 2};
  Planner fast(r, c, &measured);
  r.mode = Mode::kCanonical;
  Planner canonical(r, c, &measured);
  const Layout tp2{.tp = 2, .micro_batch = 4};
  const Prediction f = fast.predict(tp2), e = canonical.predict(tp2);
  // The same reductions (embedding, two per block forward, two per block and the head backward),
  // priced by the measured exact all-reduce instead of the fp32 one.
  const double bytes = 4.0 * 256 * 512 * 2;  // mb·T·d_model bf16 activations
  const double count = 16.0 * (1 + 2 * 4 + 2 * 4 + 1);
  EXPECT_NEAR(f.time.tp_comm, count * all_reduce_time(bytes, 2, c.intra, c.measured), 1e-9);
  EXPECT_NEAR(e.time.tp_comm, count * exact_all_reduce_time(bytes, 2, c.intra, c.measured), 1e-9);
  // The exact sums beside the fp32 gradients: 13 bytes a parameter instead of 4.
  EXPECT_NEAR(e.memory.grads, f.memory.grads * 13 / 4, 1e-6 * f.memory.grads);
  // ZeRO-2 reduce-scatters each micro-batch's buckets into running exact sums: priced by that
  // reduce-scatter where it was measured (here slower than two thirds of the exact all-reduce) —
  // the one inside a rank's shard for buckets smaller than a shard, the even one for a bucket of
  // the whole gradient; ZeRO-1's one exact all-reduce a step is not.
  const ComputeProfile one_rank = profile(1, false, 4, {0.01, 0.02, 0}, 0);
  Cluster timed_scatter = c;
  timed_scatter.measured.exact_scatter = {{1e3, 2.9e-5}, {1e8, 4.9e-2}};
  timed_scatter.measured.exact_scatter_owned = {{1e3, 3e-5}, {1e8, 6e-2}};
  const Layout z1{.dp = 2, .micro_batch = 4, .zero = 1}, z2{.dp = 2, .micro_batch = 4, .zero = 2};
  PlanRequest small_buckets = r, one_bucket = r;
  small_buckets.bucket_bytes = 1 << 20;
  one_bucket.bucket_bytes = 1e9;
  for (const PlanRequest& b : {small_buckets, one_bucket}) {
    Planner priced(b, c, &one_rank), timed(b, timed_scatter, &one_rank);
    EXPECT_GT(timed.predict(z2).time.dp_exposed, priced.predict(z2).time.dp_exposed);
    EXPECT_EQ(timed.predict(z1).time.dp_exposed, priced.predict(z1).time.dp_exposed);
  }
  Cluster owned_slower = timed_scatter;
  owned_slower.measured.exact_scatter_owned = {{1e3, 6e-5}, {1e8, 1.2e-1}};
  EXPECT_GT(Planner(small_buckets, owned_slower, &one_rank).predict(z2).time.dp_exposed,
            Planner(small_buckets, timed_scatter, &one_rank).predict(z2).time.dp_exposed);
  EXPECT_EQ(Planner(one_bucket, owned_slower, &one_rank).predict(z2).time.dp_exposed,
            Planner(one_bucket, timed_scatter, &one_rank).predict(z2).time.dp_exposed);
}

// Fast mode sums the gradients over the replicas as [parallel] reduce says: "fast" by an fp32
// reduce-scatter and all-gather, "exact" (the default) by sending each rank's fp32 values to their
// owner, which adds them exactly — priced by that reduce-scatter where it was measured (here
// slower than the fp32 one: the exact additions), and at the fp32 bytes where it was not.
TEST(PlanCostModel, FastModeReducesAsConfigured) {
  PlanRequest r = request();
  const ComputeProfile one_rank = profile(1, false, 4, {0.01, 0.02, 0}, 0);
  Cluster c = cluster(2, 1, 80);
  c.measured = {.fp32 = {{1e3, 1e-5}, {1e8, 1e-2}}, .gather = {{1e3, 5e-6}, {1e8, 5e-3}}, .ranks = 2};
  Cluster timed = c;
  timed.measured.exact_fp32_scatter = {{1e3, 2e-5}, {1e8, 2e-2}};
  timed.measured.exact_fp32_scatter_owned = {{1e3, 3e-5}, {1e8, 3e-2}};
  PlanRequest fast_reduce = r;
  fast_reduce.exact_reduce = false;
  for (const Layout& l : {Layout{.dp = 2, .micro_batch = 4}, Layout{.dp = 2, .micro_batch = 4, .zero = 2}}) {
    const double fp32 = Planner(fast_reduce, timed, &one_rank).predict(l).time.dp_exposed;
    EXPECT_EQ(Planner(fast_reduce, c, &one_rank).predict(l).time.dp_exposed, fp32) << l.text();
    EXPECT_GT(Planner(r, timed, &one_rank).predict(l).time.dp_exposed, 1.5 * fp32) << l.text();
    // Without the measurement: priced below the measured one (next: as what).
    EXPECT_LT(Planner(r, c, &one_rank).predict(l).time.dp_exposed, Planner(r, timed, &one_rank).predict(l).time.dp_exposed)
        << l.text();
  }
  // That reduce-scatter without its samples is half the (measured) all-reduce; with them, the
  // samples — a bucket inside one rank's shard by the owned ones.
  for (double bytes : {1e3, 3e5, 1e8}) {
    EXPECT_DOUBLE_EQ(exact_fp32_reduce_scatter_time(bytes, 2, c.intra, c.measured, false),
                     all_reduce_time(bytes, 2, c.intra, c.measured) / 2);
    EXPECT_GT(exact_fp32_reduce_scatter_time(bytes, 2, c.intra, timed.measured, true),
              exact_fp32_reduce_scatter_time(bytes, 2, c.intra, timed.measured, false));
  }
  EXPECT_DOUBLE_EQ(exact_fp32_reduce_scatter_time(1e8, 2, c.intra, timed.measured, false), 2e-2);
  // Canonical mode's fast reduction rounds its exact sums first and sends fp32: the fp32 all-reduce.
  PlanRequest canonical_fast = fast_reduce;
  canonical_fast.mode = Mode::kCanonical;
  const Layout z0{.dp = 2, .micro_batch = 4};
  EXPECT_EQ(Planner(canonical_fast, timed, &one_rank).predict(z0).time.dp_exposed,
            Planner(fast_reduce, timed, &one_rank).predict(z0).time.dp_exposed);
}

// The validation times a layout's collectives again just before its run: a planner given them
// prices the layout as one built on them from the start, and the communication alone moves.
TEST(PlanCostModel, MeasuredLinksSetAgainReplaceTheFirst) {
  PlanRequest r = request();
  r.mode = Mode::kCanonical;
  ComputeProfile measured = profile(2, false, 4, {0.01, 0.02, 0}, 0);
  measured.set({1, false, 4, Recompute::kNone}, {0.015, 0.03, 0.002});
  CollectiveBench first, slower;
  first.ranks = slower.ranks = 2;
  first.all_reduce = {{1e3, 1e-5}, {1e8, 1e-2}};
  first.exact_all_reduce = {{1e3, 3e-5}, {1e8, 5e-2}};
  first.exact_reduce_scatter = first.exact_reduce_scatter_owned = {{1e3, 2e-5}, {1e8, 4e-2}};
  first.all_gather = {{1e3, 3e-6}, {1e8, 3e-3}};
  first.fit = fit_ring_all_reduce(first.all_reduce, 2);
  const auto half_again = [](std::vector<CollectiveSample> v) {
    for (CollectiveSample& x : v) x.seconds *= 1.5;
    return v;
  };
  slower.all_reduce = half_again(first.all_reduce);
  slower.exact_all_reduce = half_again(first.exact_all_reduce);
  slower.exact_reduce_scatter = slower.exact_reduce_scatter_owned = half_again(first.exact_reduce_scatter);
  slower.all_gather = half_again(first.all_gather);
  slower.fit = fit_ring_all_reduce(slower.all_reduce, 2);
  Cluster c = cluster(2, 1, 80);
  c.comm_beside_compute = false;
  Cluster c_slower = c;
  set_measured_links(c, first);
  set_measured_links(c_slower, slower);
  Planner again(r, c, &measured);
  Planner built_slower(r, c_slower, &measured);
  for (const Layout& l : {Layout{.tp = 2, .micro_batch = 4}, Layout{.dp = 2, .micro_batch = 4, .zero = 2}}) {
    const Prediction before = again.predict(l);
    again.set_measured_links(slower);
    const Prediction after = again.predict(l), reference = built_slower.predict(l);
    EXPECT_EQ(after.time.total, reference.time.total) << l.text();
    EXPECT_GT(after.time.tp_comm + after.time.dp_exposed, before.time.tp_comm + before.time.dp_exposed) << l.text();
    EXPECT_EQ(after.time.compute, before.time.compute) << l.text();
    again.set_measured_links(first);
    EXPECT_EQ(again.predict(l).time.total, before.time.total) << l.text();
  }
  // The parameters' gathers are priced by the measured all-gathers: ZeRO-1's after the update by
  // the back-to-back one, ZeRO-3's of each layer by the one whose buffers the caches no longer
  // hold. ZeRO-0, which gathers nothing, moves with neither.
  first.layer_gather = {{1e3, 2e-5}, {1e8, 8e-3}};
  again.set_measured_links(first);
  CollectiveBench slower_gathers = first, slower_layer_gathers = first;
  slower_gathers.all_gather = slower.all_gather;
  slower_layer_gathers.layer_gather = half_again(first.layer_gather);
  const Layout z0{.dp = 2, .micro_batch = 4}, z1{.dp = 2, .micro_batch = 4, .zero = 1},
      z3{.dp = 2, .micro_batch = 4, .zero = 3};
  const Prediction z0_before = again.predict(z0), z1_before = again.predict(z1), z3_before = again.predict(z3);
  again.set_measured_links(slower_gathers);
  EXPECT_EQ(again.predict(z3).time.dp_exposed, z3_before.time.dp_exposed);
  EXPECT_GT(again.predict(z1).time.dp_exposed, z1_before.time.dp_exposed);
  EXPECT_EQ(again.predict(z0).time.dp_exposed, z0_before.time.dp_exposed);
  again.set_measured_links(slower_layer_gathers);
  EXPECT_GT(again.predict(z3).time.dp_exposed, z3_before.time.dp_exposed);
  EXPECT_EQ(again.predict(z1).time.dp_exposed, z1_before.time.dp_exposed);
  EXPECT_EQ(again.predict(z0).time.dp_exposed, z0_before.time.dp_exposed);
}

// Ranks that meet at collectives wait for the slowest at each: the cluster's skew share of the
// busiest rank's compute, set with the measured links; a pipeline's stages, which meet only at
// their sends, and one rank do not pay it.
TEST(PlanCostModel, RanksMeetingAtCollectivesWaitForTheSlowest) {
  const PlanRequest r = request();
  CollectiveBench skewed;
  skewed.ranks = 2;
  skewed.all_reduce = {{1e3, 1e-5}, {1e8, 1e-2}};
  skewed.fit = fit_ring_all_reduce(skewed.all_reduce, 2);
  skewed.skew.share = 0.03;
  CollectiveBench in_step = skewed;
  in_step.skew.share = 0;
  Cluster c = cluster(2, 1, 80);
  set_measured_links(c, skewed);
  EXPECT_EQ(c.sync_skew, 0.03);
  Planner planner(r, c);
  Cluster c_in_step = cluster(2, 1, 80);
  set_measured_links(c_in_step, in_step);
  Planner unskewed(r, c_in_step);
  for (const Layout& l : {Layout{.dp = 2, .micro_batch = 4}, Layout{.dp = 2, .micro_batch = 4, .zero = 3},
                          Layout{.tp = 2, .micro_batch = 4}, Layout{.pp = 2, .micro_batch = 4},
                          Layout{.micro_batch = 4}}) {
    const Prediction p = planner.predict(l), q = unskewed.predict(l);
    const bool meets = l.dp > 1 || l.tp > 1;
    EXPECT_EQ(q.time.skew, 0) << l.text();
    EXPECT_NEAR(p.time.skew, meets ? 0.03 * p.time.compute : 0, 1e-15) << l.text();
    EXPECT_NEAR(p.time.total, q.time.total + p.time.skew, 1e-12 * q.time.total) << l.text();
  }
  // Timed again before a run, the share moves with the links.
  planner.set_measured_links(in_step);
  EXPECT_EQ(planner.predict(Layout{.tp = 2, .micro_batch = 4}).time.skew, 0);
}

// On the local cluster the GEMMs keep a packing scratch as large as the largest product's two
// operands (the start-up measurement frees its own), which counts as the rank's. Here the head's
// input gradient: (tokens + d_model) x vocabulary elements, two bytes each in bf16.
TEST(PlanMemory, PackingScratchOfTheLargestProduct) {
  const PlanRequest r{.model = describe_model(gpt(8192, 256, 256, 2, 4, 4)), .global_batch = 8, .precision = Precision::kBf16, .source = "test"};
  const Cluster declared = cluster(1, 1, 80);
  Cluster local = declared;
  local.keeps_packed_operands = true;
  Planner without(r, declared), with(r, local);
  for (const auto& [micro, tokens] : {std::pair{4, 1024.0}, std::pair{1, 256.0}}) {
    const Layout l{.micro_batch = micro};
    const double scratch = (tokens + 256) * 8192 * 2;
    EXPECT_NEAR(with.predict(l).memory.activations - without.predict(l).memory.activations, scratch, 1e-6 * scratch)
        << micro;
  }
}

// Full recomputation rebuilds one layer at a time, but the layers of a kind share one set and each
// kind keeps its own (layer.hpp's SlotActivations): an MLP's set counts beside attention's larger
// one. Here long sequences make attention's set and backward scratch the largest; a wider MLP
// adds its rebuilt set's growth (its fc output and activation, bf16) and nothing else.
TEST(PlanMemory, EachRecomputedKindRebuildsInASetOfItsOwn) {
  const auto with_ffn = [](int64_t F) {
    ModelConfig m = gpt(1024, 4096, 512, 4, 8, 4);
    m.ffn_hidden = F;
    return PlanRequest{.model = describe_model(m), .global_batch = 16, .precision = Precision::kBf16, .source = "test"};
  };
  const Cluster c = cluster(1, 1, 80);
  const Layout full{.micro_batch = 1, .recompute = Recompute::kFull};
  const double narrow = Planner(with_ffn(1024), c).predict(full).memory.activations;
  const double wide = Planner(with_ffn(2048), c).predict(full).memory.activations;
  const double grown = 4096.0 * 2 * 1024 * 2;  // tokens x (fc output + activation) x bf16 bytes
  EXPECT_NEAR(wide - narrow, grown, 1e-9 * wide);
}

// Canonical mode's tensor-parallel reductions are exact: a micro-batch's stream (tokens x d_model
// elements) summed in doubles with a flag each (9 bytes), every rank's doubles of this rank's part
// received (8), their exact sums (9 a part's element), and without sequence parallelism the
// rounded part (4 a part's element). Fast mode's fp32 reductions keep none of it.
TEST(PlanMemory, CanonicalTensorParallelReductionsKeepExactSums) {
  PlanRequest r = request();
  const Cluster c = cluster(2, 1, 80);
  Planner fast(r, c);
  r.mode = Mode::kCanonical;
  Planner canonical(r, c);
  const double n = 4.0 * 256 * 512;  // a micro-batch of 4 sequences of 256 tokens, d_model 512
  for (const bool sp : {false, true}) {
    const Layout tp2{.tp = 2, .micro_batch = 4, .sp = sp};
    const double kept = canonical.predict(tp2).memory.activations - fast.predict(tp2).memory.activations;
    EXPECT_NEAR(kept, n * (9 + 8 + 9.0 / 2 + (sp ? 0 : 4.0 / 2)), 1e-9 * kept) << sp;
  }
  const Layout one{.micro_batch = 4};
  EXPECT_EQ(canonical.predict(one).memory.activations, fast.predict(one).memory.activations);
}

// A cluster whose trainer keeps bf16 values in fp32 containers (the CPU backend) holds a bf16
// run's activations and sends its tensor-parallel sums in as many bytes as an fp32 run's, and its
// weight copy, where its linears read one, in 4 bytes a matrix element; a GPU halves the
// activations (all but the head's fp32 logits) and keeps the copy in 2.
TEST(PlanMemory, LowPrecisionInFp32ContainersTakesFp32Bytes) {
  PlanRequest r = request();
  const auto run = [&](const Cluster& c, Precision p, const Layout& l) {
    r.precision = p;
    return Planner(r, c).predict(l);
  };
  const Cluster gpu = cluster(8, 1, 80, 0);  // no latency: a collective's time is its bytes'
  Cluster cpu = gpu;
  cpu.low_precision_in_fp32 = true;
  for (const Layout& l : {Layout{.micro_batch = 2}, Layout{.tp = 8, .micro_batch = 2, .sp = true}}) {
    const Prediction fp32 = run(gpu, Precision::kF32, l), gpu_bf16 = run(gpu, Precision::kBf16, l);
    const Prediction cpu_fp32 = run(cpu, Precision::kF32, l), cpu_bf16 = run(cpu, Precision::kBf16, l);
    EXPECT_EQ(cpu_fp32.memory.total(), fp32.memory.total()) << l.text();
    EXPECT_EQ(cpu_bf16.memory.activations, fp32.memory.activations) << l.text();
    EXPECT_LT(gpu_bf16.memory.activations, 0.6 * fp32.memory.activations) << l.text();
    EXPECT_EQ(cpu_bf16.time.tp_comm, cpu_fp32.time.tp_comm) << l.text();
    EXPECT_NEAR(gpu_bf16.time.tp_comm, cpu_bf16.time.tp_comm / 2, 1e-9 * cpu_bf16.time.tp_comm) << l.text();
    // The copy: the matrices' elements, 4 bytes each here against 2 on the GPU; none where the
    // linears read the master weights rounded.
    const double copy = cpu_bf16.memory.params - fp32.memory.params;
    EXPECT_GT(copy, 0) << l.text();
    EXPECT_DOUBLE_EQ(gpu_bf16.memory.params - fp32.memory.params, copy / 2) << l.text();
    Cluster rounded = cpu;
    rounded.bf16_weight_copy = false;
    EXPECT_EQ(run(rounded, Precision::kBf16, l).memory.params, fp32.memory.params) << l.text();
  }
}

TEST(PlanProfile, ShapesAreTheTrainersAndTheReportRoundTrips) {
  RunConfig run;
  run.source = "test";
  run.model.vocab_size = 256;
  run.model.seq_len = 64;
  run.model.d_model = 64;
  run.model.n_layers = 2;
  run.model.n_heads = 2;
  run.model.n_kv_heads = 2;
  run.train.mode = Mode::kFast;
  const std::vector<PassShape> shapes = profile_shapes(run, 2, 4);
  // tp 1, tp 2 and tp 2 sp; micro-batches 1, 2, 4; three recomputations.
  EXPECT_EQ(shapes.size(), 3u * 3u * 3u);
  run.model.n_heads = run.model.n_kv_heads = 1;  // one head does not split over two ranks
  for (const PassShape& s : profile_shapes(run, 2, 4)) EXPECT_EQ(s.tp, 1);
  run.model.n_heads = run.model.n_kv_heads = 2;

  // One rank of two, sequence parallel and recomputing, timed for real (its shard runs every
  // pass on its own: solo_tp_group.hpp).
  const PassTimes full = time_passes(run, {2, true, 2, Recompute::kFull}, 2);
  EXPECT_GT(full.forward, 0);
  EXPECT_GT(full.backward, 0);
  EXPECT_GT(full.optimizer, 0);
  EXPECT_GT(full.state_at_rest, 0);  // [verify] state_at_rest is on by default

  ComputeProfile p;
  p.runtime_bytes = 30 << 20;
  p.bf16_weight_copy = false;
  p.set({2, true, 2, Recompute::kFull}, full);
  const ComputeProfile back = ComputeProfile::from_json(p.to_json(), "report");
  EXPECT_EQ(back.runtime_bytes, p.runtime_bytes);
  EXPECT_FALSE(back.bf16_weight_copy);
  EXPECT_EQ(back.at({2, true, 2, Recompute::kFull}).backward, full.backward);
  EXPECT_EQ(back.at({2, true, 2, Recompute::kFull}).state_at_rest, full.state_at_rest);
  EXPECT_THROW(back.at({2, true, 2, Recompute::kNone}), InternalError);
  EXPECT_THROW(ComputeProfile::from_json(nlohmann::json::object(), "bad.json"), DataError);

  // 256 positions cut into 2·cp blocks of whole chunks of 64: cp 2 beside tp 1 (tp · cp ranks).
  run.model.seq_len = 256;
  // cp 2 by all-gather and by the ring.
  const std::vector<PassShape> with_cp = profile_shapes(run, 2, 4);
  EXPECT_EQ(with_cp.size(), 5u * 3u * 3u);
  for (const PassShape& s : with_cp) EXPECT_TRUE(s.cp == 1 || s.tp == 1) << s.tp << " " << s.cp;
  for (const PassShape& s : with_cp) EXPECT_TRUE(!s.ring || s.cp == 2) << s.tp << " " << s.cp;
  EXPECT_EQ(std::count_if(with_cp.begin(), with_cp.end(), [](const PassShape& s) { return s.ring; }), 3 * 3);
  EXPECT_EQ(std::count_if(with_cp.begin(), with_cp.end(), [](const PassShape& s) { return s.cp == 2; }), 2 * 3 * 3);
  // One cp rank of two, on its own (solo_communicator.hpp): half the positions of the sequence.
  const PassShape cp2{1, false, 2, Recompute::kNone, 2};
  const PassTimes half = time_passes(run, cp2, 2);
  EXPECT_GT(half.forward, 0);
  EXPECT_GT(half.backward, 0);
  p.set(cp2, half);
  EXPECT_EQ(ComputeProfile::from_json(p.to_json(), "report").at(cp2).forward, half.forward);
  EXPECT_THROW(back.at({1, false, 2, Recompute::kNone, 2}), InternalError);
  // The same rank over the ring (its messages matched on the solo group), recomputing the scores
  // block by block: a shape of its own in the report.
  const PassShape ring2{1, false, 2, Recompute::kNone, 2, true};
  const PassTimes ring = time_passes(run, ring2, 2);
  EXPECT_GT(ring.forward, 0);
  EXPECT_GT(ring.backward, 0);
  p.set(ring2, ring);
  const ComputeProfile both = ComputeProfile::from_json(p.to_json(), "report");
  EXPECT_EQ(both.at(ring2).backward, ring.backward);
  EXPECT_EQ(both.at(cp2).backward, half.backward);
}

// A cp rank timed on its own: every other rank's contribution is the one it sends itself, copied
// where the group's would arrive.
TEST(PlanProfile, SoloGroupCopiesThisRanksPartOnly) {
  SoloCommunicator g(3, "cp");
  EXPECT_EQ(g.size(), 3);
  EXPECT_EQ(g.rank(), 0);
  const std::vector<float> mine = {1, 2};
  std::vector<float> all(6, 0.0f);
  g.all_gather(mine.data(), all.data(), 2, DType::kF32);
  EXPECT_EQ(all, (std::vector<float>{1, 2, 1, 2, 1, 2}));
  // all-to-all: the block this rank sends itself, in every rank's slot.
  const std::vector<int64_t> send = {7, 8, 9};
  std::vector<int64_t> recv(3, 0);
  g.all_to_all(send.data(), recv.data(), 1, DType::kI64);
  EXPECT_EQ(recv, (std::vector<int64_t>{7, 7, 7}));
  // reduce-scatter: this rank's block of its own values.
  const std::vector<float> full = {4, 5, 6};
  float out = 0;
  const std::vector<int64_t> counts = {1, 1, 1};
  g.reduce_scatter(full.data(), &out, counts, DType::kF32, comm::ReduceOp::kSum);
  EXPECT_EQ(out, 4.0f);
  // The ring: a receive gets the message of its tag this rank sends, posted before or after it.
  std::vector<float> got(2, 0.0f);
  comm::Handle sent = g.isend(mine.data(), 2, DType::kF32, 1, 5);
  comm::Handle other = g.isend(full.data(), 2, DType::kF32, 1, 6);
  comm::Handle received = g.irecv(got.data(), 2, DType::kF32, 2, 5);
  sent.wait();
  received.wait();
  EXPECT_EQ(got, mine);
  std::vector<float> later(2, 0.0f);
  received = g.irecv(later.data(), 2, DType::kF32, 2, 7);
  EXPECT_EQ(later, (std::vector<float>{0, 0}));  // nothing sent with tag 7 yet
  sent = g.isend(mine.data() + 1, 1, DType::kF32, 1, 7);
  EXPECT_EQ(later, (std::vector<float>{2, 0}));
  received = g.irecv(got.data(), 2, DType::kF32, 2, 6);
  EXPECT_EQ(got, (std::vector<float>{4, 5}));
  EXPECT_THROW(g.send(mine.data(), 2, DType::kF32, 3, 0), InternalError);
  other.wait();
}

TEST(PlanSearch, RanksFittingLayoutsAndNamesEveryRejection) {
  const PlanRequest r = request(4, 64);
  const Cluster c = cluster(8, 2, 80);
  Planner planner(r, c);
  const SearchResult s = planner.search();
  ASSERT_FALSE(s.ranked.empty());
  int64_t rejected = 0;
  for (const auto& [kind, why] : s.rejected) {
    rejected += why.count;
    EXPECT_FALSE(why.text.empty()) << kind;
    EXPECT_FALSE(planner.problem(why.example).empty() && planner.fits(planner.predict(why.example)).empty()) << kind;
  }
  EXPECT_EQ(rejected + static_cast<int64_t>(s.ranked.size()), s.considered);
  for (size_t i = 0; i < s.ranked.size(); ++i) {
    EXPECT_TRUE(planner.fits(s.ranked[i]).empty());
    EXPECT_EQ(s.ranked[i].layout.gpus(), 16);
    if (i > 0) {
      EXPECT_LE(s.ranked[i - 1].time.total, s.ranked[i].time.total);
    }
  }
  // Deterministic: a second search gives the same order.
  const SearchResult again = Planner(r, c).search();
  ASSERT_EQ(again.ranked.size(), s.ranked.size());
  for (size_t i = 0; i < s.ranked.size(); ++i) EXPECT_EQ(again.ranked[i].layout.text(), s.ranked[i].layout.text());
  EXPECT_EQ(s.rejected.count("tp layout"), 0u);  // 8 heads divide every tp up to 8
  EXPECT_GT(s.rejected.at("batch split").count, 0);
  // 256 positions: cp 2 runs; cp 4 and more do not cut them into whole chunks.
  EXPECT_TRUE(std::any_of(s.ranked.begin(), s.ranked.end(), [](const Prediction& p) { return p.layout.cp == 2; }));
  EXPECT_TRUE(std::none_of(s.ranked.begin(), s.ranked.end(), [](const Prediction& p) { return p.layout.cp > 2; }));
  EXPECT_GT(s.rejected.at("cp").count, 0);
}

// 8192 positions on GPUs too small for a whole sequence's probabilities (a layer's, 1 GiB, kept
// for the backward and its gradient in the scratch, even with full recomputation): each cp of 1 to
// 8 is tried, and only layouts that split the sequence (cp) or the heads (tp) fit.
TEST(PlanSearch, LongSequencesNeedContextParallelism) {
  const PlanRequest r = long_request(Mode::kFast, Precision::kBf16, 8192);
  const Cluster c = cluster(8, 1, 2.5);
  Planner planner(r, c);
  const SearchResult s = planner.search();
  ASSERT_FALSE(s.ranked.empty());
  for (int64_t cp : {2, 4, 8}) {
    EXPECT_TRUE(std::any_of(s.ranked.begin(), s.ranked.end(), [&](const Prediction& p) { return p.layout.cp == cp; }))
        << cp;
  }
  for (const Prediction& p : s.ranked) EXPECT_GT(p.layout.cp * p.layout.tp, 1) << p.layout.text();
  // The ring where, and only where, the all-gather's probabilities do not fit.
  int64_t rings = 0;
  for (const Prediction& p : s.ranked) {
    if (!p.layout.ring) continue;
    ++rings;
    Layout twin = p.layout;
    twin.ring = false;
    EXPECT_FALSE(planner.fits(planner.predict(twin)).empty()) << p.layout.text();
  }
  EXPECT_GT(rings, 0);
  const Prediction whole = planner.predict({.dp = 8, .micro_batch = 1, .recompute = Recompute::kFull});
  EXPECT_FALSE(planner.fits(whole).empty());
}

TEST(PlanSearch, TooSmallAClusterIsOverByAMeasure) {
  const PlanRequest r = request(4, 64);
  const Cluster c = cluster(2, 1, 1.05);
  Planner planner(r, c);
  const SearchResult s = planner.search();
  EXPECT_TRUE(s.ranked.empty());
  ASSERT_TRUE(s.any_predicted);
  EXPECT_GT(s.least_memory.memory.total(), c.hbm_bytes);
  EXPECT_NE(planner.fits(s.least_memory).text.find("over the 1.05 GiB of HBM by"), std::string::npos);
}

// Daly's complete model by hand, and its limits: no failures, no loss; a job that fails far more
// often than it saves loses most of its time.
TEST(PlanGoodput, DalysExpectedWallTime) {
  Cluster c = cluster(8, 128, 80);
  const Goodput g = goodput(2e12, 10, c);  // 2 TB at 100 GB/s: 20 s a save
  EXPECT_DOUBLE_EQ(g.save_s, 20);
  EXPECT_DOUBLE_EQ(g.mtbf_s, 50000.0 * 3600 / 1024);
  EXPECT_DOUBLE_EQ(g.interval_s, 10.0 * static_cast<double>(g.interval_steps));
  const double M = g.mtbf_s;
  EXPECT_NEAR(g.fraction, g.interval_s / (M * std::exp(600 / M) * (std::exp((g.interval_s + 20) / M) - 1)), 1e-12);
  // First order: the loss is about √(2δ/M) + R/M.
  EXPECT_NEAR(1 - g.fraction, std::sqrt(2 * 20 / M) + 600 / M, 0.2 * (1 - g.fraction));
  c.mtbf_gpu_hours = 1e12;
  EXPECT_GT(goodput(2e12, 10, c).fraction, 0.999);
  c.mtbf_gpu_hours = 1;
  EXPECT_LT(goodput(2e12, 10, c).fraction, 0.1);
}

TEST(PlanLayout, ExpertParallelTextRoundTrips) {
  const Layout l{.dp = 4, .tp = 2, .ep = 2, .micro_batch = 2, .zero = 1};
  EXPECT_EQ(l.text(), "dp4 tp2 pp1 ep2 mb2 zero1");
  EXPECT_EQ(parse_layout(l.text(), "test").text(), l.text());
  EXPECT_EQ(l.gpus(), 16);
}

TEST(PlanLayout, ContextParallelTextRoundTrips) {
  const Layout l{.dp = 2, .tp = 2, .cp = 4, .micro_batch = 1, .zero = 3, .recompute = Recompute::kSelective};
  EXPECT_EQ(l.text(), "dp2 tp2 pp1 cp4 mb1 zero3 recompute=selective");
  EXPECT_EQ(parse_layout(l.text(), "test").text(), l.text());
  EXPECT_EQ(l.gpus(), 16);
  EXPECT_THROW(parse_layout("dp2 cp0", "test"), ConfigError);
  EXPECT_THROW(parse_layout("dp2 cp2 cp4", "test"), ConfigError);
}

TEST(PlanLayout, TextRoundTrips) {
  const Layout l{.dp = 16, .tp = 8, .pp = 8, .micro_batch = 2, .zero = 1, .sp = true, .recompute = Recompute::kSelective};
  EXPECT_EQ(l.text(), "dp16 tp8 pp8 mb2 zero1 sp 1f1b recompute=selective");
  EXPECT_EQ(parse_layout(l.text(), "test").text(), l.text());
  EXPECT_THROW(parse_layout("dp2 qq4", "test"), ConfigError);
}

TEST(PlanCluster, EveryFieldIsRequiredAndNamed) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "lockstep_plan_cluster_test";
  std::filesystem::create_directories(dir);
  const std::string good =
      "[cluster]\nname = \"x\"\ngpus_per_node = 8\nnodes = 2\nhbm_gib = 80\nreserved_gib = 2\nhbm_gbs = 2000\n"
      "[peak_tflops]\nfp32 = 19.5\nbf16 = 312\nfp8 = 0\n[efficiency]\ngemm = 0.8\nmemory = 0.75\n"
      "[intra_node]\nbandwidth_gbs = 300\nlatency_us = 5\n[inter_node]\nbandwidth_gbs = 25\nlatency_us = 10\n"
      "[reliability]\nmtbf_gpu_hours = 50000\nrestart_s = 600\n[storage]\nwrite_gbs = 100\n";
  const auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const Cluster c = load_cluster(write("good.toml", good));
  EXPECT_EQ(c.gpus(), 16);
  EXPECT_DOUBLE_EQ(c.gemm_flops(Precision::kBf16), 312e12 * 0.8);
  EXPECT_DOUBLE_EQ(c.inter.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(c.stream_bandwidth, 2000e9 * 0.75);
  const auto error = [&](const std::string& text) {
    try {
      load_cluster(write("bad.toml", text));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string missing = good;
  missing.replace(missing.find("latency_us = 10\n"), 16, "");
  ASSERT_EQ(missing.find("latency_us = 10"), std::string::npos);
  EXPECT_NE(error(missing).find("bad.toml: [inter_node] latency_us is missing"), std::string::npos) << error(missing);
  EXPECT_NE(error(good + "[disk]\nsize = 1\n").find("[disk] is not a cluster section"), std::string::npos);
  std::string unknown = good;
  unknown.replace(unknown.find("gemm = 0.8"), 10, "gemm = 0.8\nattention = 0.5");
  EXPECT_NE(error(unknown).find("[efficiency] attention is not a cluster field"), std::string::npos) << error(unknown);
  std::string no_bandwidth = good;
  no_bandwidth.replace(no_bandwidth.find("hbm_gbs = 2000\n"), 15, "");
  EXPECT_NE(error(no_bandwidth).find("bad.toml: [cluster] hbm_gbs is missing"), std::string::npos) << error(no_bandwidth);
  std::string negative = good;
  negative.replace(negative.find("nodes = 2"), 9, "nodes = 0");
  EXPECT_NE(error(negative).find("[cluster] nodes = 0 must be in [1, "), std::string::npos) << error(negative);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::plan
