// Tensor-parallel split without ranks: the shards of every tp rank tile each global tensor, and
// the kernels' tensor-parallel pieces (linear partials, vocabulary-parallel cross-entropy and
// embedding), combined as the tp group combines them, give the unsplit kernels' bits in canonical
// mode. The collectives themselves run in the mpi tests and tests/e2e/tp_canonical.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/linear.hpp"
#include "src/core/check.hpp"
#include "src/model/param_layout.hpp"
#include "src/parallel/tensor_parallel.hpp"

namespace lockstep {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

ModelConfig model(FfnKind ffn, int64_t kv_heads, bool tied) {
  ModelConfig m;
  m.vocab_size = 512;
  m.seq_len = 32;
  m.d_model = 256;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = kv_heads;
  m.ffn = ffn;
  m.ffn_hidden = 512;
  m.pos = PosKind::kLearned;
  m.tie_embeddings = tied;
  return m;
}

TEST(TpSplit, ShardsOfAllRanksTileEveryGlobalTensor) {
  for (const ModelConfig& m : {model(FfnKind::kGelu, 4, true), model(FfnKind::kSwiglu, 2, false)}) {
    const std::vector<ParamTensor> global = build_param_layout(m);
    for (int64_t tp : {1, 2, 4}) {
      if (m.n_kv_heads % tp != 0) continue;
      std::vector<std::vector<int>> held(global.size());
      for (size_t t = 0; t < global.size(); ++t) held[t].assign(static_cast<size_t>(global[t].numel), 0);
      for (int64_t r = 0; r < tp; ++r) {
        const std::vector<ParamTensor> local = build_param_layout(m, {tp, r});
        ASSERT_EQ(local.size(), global.size());
        int64_t offset = 0;
        for (size_t t = 0; t < local.size(); ++t) {
          const ParamTensor& s = local[t];
          EXPECT_EQ(s.name, global[t].name);
          EXPECT_EQ(s.offset, offset) << s.name;  // shards back to back in canonical order
          offset += s.numel;
          EXPECT_EQ(s.global_shape, global[t].shape) << s.name;
          if (s.replicated()) {
            EXPECT_EQ(s.shape, global[t].shape) << s.name;
            if (r == 0) std::fill(held[t].begin(), held[t].end(), 1);
            continue;
          }
          EXPECT_EQ(s.numel * tp, global[t].numel) << s.name << " tp " << tp;
          for (int64_t i = 0; i < s.numel; ++i) ++held[t][static_cast<size_t>(s.global_index(i))];
        }
      }
      for (size_t t = 0; t < global.size(); ++t) {
        const auto once = std::count(held[t].begin(), held[t].end(), 1);
        EXPECT_EQ(once, global[t].numel) << global[t].name << " tp " << tp << ": elements not held exactly once";
      }
    }
  }
}

// global_runs (stochastic rounding's global indices, per ZeRO shard) covers the asked range in
// order with runs on which global_index counts up by one, merged where they continue each other.
TEST(TpSplit, GlobalRunsFollowGlobalIndex) {
  const ModelConfig m = model(FfnKind::kSwiglu, 2, false);
  for (int64_t tp : {1, 2}) {
    for (int64_t r = 0; r < tp; ++r) {
      for (const ParamTensor& s : build_param_layout(m, {tp, r})) {
        for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, s.numel}, {s.numel / 3 + 1, s.numel - 5}}) {
          int64_t next = first;
          const std::vector<IndexRun> runs = s.global_runs(first, end);
          for (size_t k = 0; k < runs.size(); ++k) {
            const IndexRun& run = runs[k];
            ASSERT_EQ(run.local, next) << s.name;
            ASSERT_GT(run.length, 0) << s.name;
            for (int64_t j = 0; j < run.length; ++j) ASSERT_EQ(s.global_index(run.local + j), run.global + j) << s.name;
            if (k > 0) {
              ASSERT_NE(runs[k - 1].global + runs[k - 1].length, run.global) << s.name << ": runs not merged";
            }
            next += run.length;
          }
          ASSERT_EQ(next, std::max(first, end)) << s.name;
        }
      }
    }
  }
}

TEST(TpSplit, QkvShardHoldsTheQKAndVRowsOfItsHeads) {
  const ModelConfig m = model(FfnKind::kGelu, 2, true);  // C 256, 4 heads of 64, 2 kv heads
  const auto layout = build_param_layout(m, {2, 1});
  const auto it = std::find_if(layout.begin(), layout.end(),
                               [](const ParamTensor& t) { return t.name == "layer/0/attn/qkv/weight"; });
  ASSERT_NE(it, layout.end());
  const ParamTensor& qkv = *it;
  const std::vector<std::pair<int64_t, int64_t>> want = {{128, 256}, {256 + 64, 256 + 128}, {384 + 64, 384 + 128}};
  EXPECT_EQ(qkv.ranges, want);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(qkv.global_index(0), 128 * 256);                     // first q row of head 2
  EXPECT_EQ(qkv.global_index(128 * 256), (256 + 64) * 256);      // first k row of kv head 1
}

TEST(TpSplit, RowParallelForwardPartialsGiveTheUnsplitBits) {
  const int64_t N = 9, IC = 256, OC = 40;
  const auto inp = random_floats(N * IC, 1), w = random_floats(OC * IC, 2, 0.05f), bias = random_floats(OC, 3);
  std::vector<float> want(N * OC);
  cpu::linear_forward(Mode::kCanonical, {N, IC, OC}, want.data(), inp.data(), w.data(), bias.data());
  // Two ranks hold input features [0, 128) and [128, 256): inputs' and weights' columns.
  ExactAccumulator sum(static_cast<size_t>(N * OC));
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> x(N * 128), wr(OC * 128);
    for (int64_t n = 0; n < N; ++n) std::copy_n(inp.begin() + n * IC + r * 128, 128, x.begin() + n * 128);
    for (int64_t o = 0; o < OC; ++o) std::copy_n(w.begin() + o * IC + r * 128, 128, wr.begin() + o * 128);
    cpu::linear_forward_partials({N, 128, OC}, sum, x.data(), wr.data());
  }
  std::vector<float> got(N * OC);
  sum.round_to(got.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) got[n * OC + o] = got[n * OC + o] + bias[o];
  expect_bitwise(got, want, "row-parallel forward");
}

TEST(TpSplit, ColumnParallelInputGradientPartialsGiveTheUnsplitBits) {
  const int64_t N = 70, IC = 48, OC = 384;
  const auto dout = random_floats(N * OC, 4), w = random_floats(OC * IC, 5, 0.05f), inp = random_floats(N * IC, 6);
  std::vector<float> want(N * IC, 0.0f);
  cpu::linear_backward(Mode::kCanonical, {N, IC, OC}, 0, want.data(), {}, {}, dout.data(), inp.data(), w.data());
  // Three ranks hold output features [0,128), [128,256), [256,384): dout's columns, weight's rows.
  ExactAccumulator sum(static_cast<size_t>(N * IC));
  for (int64_t r = 0; r < 3; ++r) {
    std::vector<float> d(N * 128);
    for (int64_t n = 0; n < N; ++n) std::copy_n(dout.begin() + n * OC + r * 128, 128, d.begin() + n * 128);
    cpu::linear_backward_dinp_partials({N, IC, 128}, sum, d.data(), w.data() + r * 128 * IC);
  }
  std::vector<float> got(N * IC);
  sum.round_to(got.data());
  expect_bitwise(got, want, "column-parallel dinp");
}

TEST(TpSplit, VocabularyParallelCrossEntropyGivesTheUnsplitBits) {
  const int64_t N = 7, V = 384, shards = 3, VL = V / shards;
  const float dloss = 1.0f / 448.0f;
  auto logits = random_floats(N * V, 7, 3.0f);
  std::vector<int32_t> targets = {0, 383, 128, 127, 255, 5, 300};
  std::vector<float> want_losses(N), want_d = logits;
  cpu::crossentropy_forward_backward(Mode::kCanonical, {N, V}, dloss, want_losses.data(), want_d.data(), targets.data());

  std::vector<std::vector<float>> part(shards);
  for (int64_t r = 0; r < shards; ++r) {
    part[r].resize(N * VL);
    for (int64_t n = 0; n < N; ++n) std::copy_n(logits.begin() + n * V + r * VL, VL, part[r].begin() + n * VL);
  }
  // 1. max over the ranks; 2. exact sum of Z, fp32 sum of the target logits; 3. each rank finishes.
  std::vector<float> m(N, -INFINITY), local(N), target(N, -0.0f), t(N), Z(N);
  for (int64_t r = 0; r < shards; ++r) {
    cpu::crossentropy_shard_max({N, VL, r * VL, V}, local.data(), part[r].data());
    for (int64_t n = 0; n < N; ++n) m[n] = std::max(m[n], local[n]);
  }
  ExactAccumulator zsum(N);
  for (int64_t r = 0; r < shards; ++r) {
    cpu::crossentropy_shard_partition(Mode::kCanonical, {N, VL, r * VL, V}, zsum, t.data(), part[r].data(), m.data(),
                                      targets.data());
    for (int64_t n = 0; n < N; ++n) target[n] = target[n] + t[n];
  }
  zsum.round_to(Z.data());
  std::vector<float> got_d(N * V);
  for (int64_t r = 0; r < shards; ++r) {
    std::vector<float> losses(N);
    cpu::crossentropy_shard_finish(Mode::kCanonical, {N, VL, r * VL, V}, dloss, losses.data(), part[r].data(),
                                   part[r].data(), m.data(), Z.data(), target.data(), targets.data());
    expect_bitwise(losses, want_losses, "vocabulary-parallel losses");
    for (int64_t n = 0; n < N; ++n) std::copy_n(part[r].begin() + n * VL, VL, got_d.begin() + n * V + r * VL);
  }
  expect_bitwise(got_d, want_d, "vocabulary-parallel dlogits");
}

TEST(TpSplit, VocabularyParallelEmbeddingGivesTheUnsplitBits) {
  const int64_t B = 2, T = 64, C = 16, V = 256, VL = 128, N = B * T;
  const auto wte = random_floats(V * C, 8), wpe = random_floats(T * C, 9), dout = random_floats(N * C, 10);
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 37 + i / 5) % V);
  std::vector<float> want(N * C);
  cpu::embedding_forward(Mode::kCanonical, {B, T, C, V}, want.data(), tokens.data(), wte.data(), wpe.data());
  ExactAccumulator want_dwte(V * C), want_dwpe(T * C);
  cpu::embedding_backward(Mode::kCanonical, {B, T, C, V}, 0, {nullptr, &want_dwte, 0}, {nullptr, &want_dwpe, 0},
                          dout.data(), tokens.data());

  std::vector<float> sum(N * C, -0.0f), out(N * C);
  for (int64_t r = 0; r < 2; ++r) {
    const EmbeddingShape s{B, T, C, V, r * VL, VL};
    cpu::embedding_forward(Mode::kCanonical, s, out.data(), tokens.data(), wte.data() + r * VL * C, wpe.data());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + out[i];
    ExactAccumulator dwte(VL * C), dwpe(T * C);
    cpu::embedding_backward(Mode::kCanonical, s, 0, {nullptr, &dwte, 0}, {nullptr, &dwpe, 0}, dout.data(),
                            tokens.data());
    std::vector<float> got(VL * C), ref(VL * C), gp(T * C), rp(T * C);
    dwte.round_to(got.data());
    for (int64_t i = 0; i < VL * C; ++i) ref[i] = want_dwte.round(static_cast<size_t>(r * VL * C + i));
    expect_bitwise(got, ref, "vocabulary-parallel dwte rows");
    dwpe.round_to(gp.data());
    want_dwpe.round_to(rp.data());
    expect_bitwise(gp, rp, "dwpe on every rank");
  }
  expect_bitwise(sum, want, "sum of the shards' embeddings");
}

TEST(TpSplit, LayoutsThatCannotSplitAreRefusedNamingWhy) {
  auto message = [](const ModelConfig& m, int64_t tp, bool sp, Mode mode, int64_t micro_tokens = 256) -> std::string {
    try {
      parallel::check_tp_layout(m, tp, sp, micro_tokens, mode, "cfg.toml");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig m = model(FfnKind::kGelu, 4, true);
  EXPECT_EQ(message(m, 4, false, Mode::kCanonical), "");
  EXPECT_EQ(message(m, 2, false, Mode::kCanonical), "");
  m.vocab_size = 257;
  EXPECT_NE(message(m, 2, false, Mode::kFast).find("cfg.toml: [model] vocab_size (257) must be a multiple of "
                                                   "[parallel] tp (2)"), std::string::npos);
  m.vocab_size = 512;
  m.d_model = 128;
  EXPECT_NE(message(m, 4, false, Mode::kCanonical).find("canonical mode with tp = 4 needs d_model / tp (32) to be "
                                                        "a multiple of the canonical chunk 64"), std::string::npos);
  EXPECT_EQ(message(m, 4, false, Mode::kFast), "");  // fast mode has no chunks to keep
  m.d_model = 256;
  m.n_kv_heads = 2;
  EXPECT_NE(message(m, 4, false, Mode::kFast).find("n_kv_heads (2) must be a multiple of [parallel] tp (4)"),
            std::string::npos);
  m.n_kv_heads = 4;
  EXPECT_EQ(message(m, 2, true, Mode::kCanonical), "");
  EXPECT_NE(message(m, 1, true, Mode::kCanonical).find("sp = true needs tp > 1"), std::string::npos);
  EXPECT_EQ(message(m, 4, true, Mode::kCanonical), "");  // 256 tokens: 64 per rank
  EXPECT_NE(message(m, 4, true, Mode::kCanonical, 128).find("micro-batch tokens / tp (128 / 4 = 32) to be a "
                                                           "multiple of the canonical chunk 64"), std::string::npos);
  EXPECT_EQ(message(m, 4, true, Mode::kFast, 128), "");
}

TEST(TpSplit, CommunicationMinimumCountsEveryActivationAllReduce) {
  ModelConfig m = model(FfnKind::kGelu, 4, true);
  EXPECT_EQ(parallel::tp_min_bytes(m, 1, false, 1024), 0u);
  // (4 L + 2) all-reduces of tokens x C plus 3 of tokens, 8 (p-1)/p bytes per value.
  EXPECT_EQ(parallel::tp_min_bytes(m, 2, false, 1024), ((4 * 2 + 2) * 1024 * 256 + 3 * 1024) * 4u);
  EXPECT_EQ(parallel::tp_min_bytes(m, 4, false, 1024), ((4 * 2 + 2) * 1024 * 256 + 3 * 1024) * 6u);
  // Sequence parallelism adds the norm gradients' sum: 2 layers x 2 LayerNorms + the final one, C
  // weights and C biases each.
  EXPECT_EQ(parallel::tp_min_bytes(m, 2, true, 1024), ((4 * 2 + 2) * 1024 * 256 + 3 * 1024 + 5 * 2 * 256) * 4u);
}

}  // namespace
}  // namespace lockstep
