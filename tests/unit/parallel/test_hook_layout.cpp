// hook_layout against the model itself: p threads each run one tp rank's Model (the tensor-parallel
// plan over an in-process TpGroup), in canonical mode, and every tensor their hooks see, placed with hook_shard into its
// global tensor, must be bitwise the one-device model's under the same name and shape — every
// hook name, tp 2 and 4, sequence parallelism off and on, two micro-batches per step (as a dump
// concatenates them), and a second model (SwiGLU halves, grouped KV heads, RMSNorm, RoPE).
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/core/check.hpp"
#include "src/model/model.hpp"
#include "src/model/hook_layout.hpp"
#include "src/parallel/tp_plan.hpp"

namespace lockstep {
namespace {

// TpGroup between the threads of one process. Each collective: every rank publishes its input,
// all wait, each computes its result from every rank's input into scratch, all wait again (no
// input is overwritten while another rank reads it), then each writes its result.
class ThreadTpGroup final : public parallel::TpGroup {
 public:
  struct Shared {
    explicit Shared(int64_t p) : size(p), sync(p), inputs(static_cast<size_t>(p)) {}
    int64_t size;
    std::barrier<> sync;
    std::vector<const void*> inputs;
  };
  ThreadTpGroup(Shared& shared, int64_t rank) : s_(shared), rank_(rank) {}
  int64_t size() const override { return s_.size; }
  int64_t rank() const override { return rank_; }

  void all_reduce_exact(const ExactAccumulator& acc, float* x) override { exact(acc, x, 0, acc.size()); }
  void reduce_scatter_exact(const ExactAccumulator& acc, float* local) override {
    const size_t n = acc.size() / static_cast<size_t>(s_.size);
    exact(acc, local, static_cast<size_t>(rank_) * n, n);
  }
  // fp32 sums in rank order: the same bits on every rank.
  void all_reduce_sum(float* x, int64_t n) override { fp32(x, x, 0, n, [](float a, float b) { return a + b; }); }
  void reduce_scatter_sum(const float* full, float* local, int64_t n) override {
    fp32(full, local, rank_ * n, n, [](float a, float b) { return a + b; });
  }
  void all_reduce_max(float* x, int64_t n) override {
    fp32(x, x, 0, n, [](float a, float b) { return std::max(a, b); });
  }
  void all_gather(const float* local, float* full, int64_t n) override {
    collective(local, static_cast<size_t>(s_.size * n), full, [&](std::vector<float>& out) {
      for (int64_t r = 0; r < s_.size; ++r) {
        const auto* in = static_cast<const float*>(s_.inputs[static_cast<size_t>(r)]);
        std::copy(in, in + n, out.begin() + r * n);
      }
    });
  }

 private:
  template <class Compute>
  void collective(const void* in, size_t n, float* result, Compute compute) {
    s_.inputs[static_cast<size_t>(rank_)] = in;
    s_.sync.arrive_and_wait();
    scratch_.assign(n, 0.0f);
    compute(scratch_);
    s_.sync.arrive_and_wait();
    std::copy(scratch_.begin(), scratch_.end(), result);
  }
  // out = elements [first, first + n) of the exact sum over ranks, rounded once.
  void exact(const ExactAccumulator& acc, float* out, size_t first, size_t n) {
    collective(&acc, n, out, [&](std::vector<float>& result) {
      ExactAccumulator total(n);
      for (const void* in : s_.inputs) {
        const auto& a = *static_cast<const ExactAccumulator*>(in);
        for (size_t i = 0; i < n; ++i) {
          if (a.spilled(first + i)) {
            total.add(i, a.spill(first + i));
          } else {
            total.add(i, a.partial_sums()[first + i]);
          }
        }
      }
      total.round_to(result.data());
    });
  }
  template <class Op>
  void fp32(const float* in, float* out, int64_t first, int64_t n, Op op) {
    collective(in, static_cast<size_t>(n), out, [&](std::vector<float>& result) {
      for (int64_t i = 0; i < n; ++i) {
        float x = static_cast<const float*>(s_.inputs[0])[first + i];
        for (size_t r = 1; r < s_.inputs.size(); ++r) x = op(x, static_cast<const float*>(s_.inputs[r])[first + i]);
        result[static_cast<size_t>(i)] = x;
      }
    });
  }

  Shared& s_;
  int64_t rank_;
  std::vector<float> scratch_;
};

// What one model's hooks saw in one step: each name's micro-batches concatenated along dim 0.
struct Observed {
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;
};

constexpr int64_t kBatch = 8, kMicro = 4;  // two micro-batches

void run_step(Model& model, const std::vector<int32_t>& tokens, Observed& seen) {
  model.set_hook([&](std::string_view name, const TensorView& t) {
    const float* data = t.f32();
    const std::span<const int64_t> shape = t.shape.dims();
    auto [it, fresh] = seen.tensors.try_emplace(std::string(name));
    auto& [s, d] = it->second;
    if (fresh) {
      seen.order.push_back(it->first);
      s.assign(shape.begin(), shape.end());
    } else {
      s[0] += shape[0];
    }
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    d.insert(d.end(), data, data + n);
  });
  model.init_parameters();
  model.zero_grad();
  const int64_t T = model.config().seq_len;
  ChunkCombiner loss_sum;
  model.forward_backward_batch(tokens.data(), tokens.data() + 1, kBatch, kMicro, 0,
                               1.0f / static_cast<float>(kBatch * T), loss_sum);
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

void check_layout(const ModelConfig& cfg, int64_t tp, bool sp) {
  SCOPED_TRACE(testing::Message() << "tp " << tp << (sp ? " sp" : "") << " ffn " << ffn_name(cfg.ffn));
  const int64_t T = cfg.seq_len;
  std::mt19937 gen(3);
  std::vector<int32_t> tokens(static_cast<size_t>(kBatch * T + 1));  // inputs, and targets one further
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % static_cast<uint32_t>(cfg.vocab_size));

  Observed one;
  Model single(cfg, Mode::kCanonical, kMicro);
  run_step(single, tokens, one);

  ThreadTpGroup::Shared shared(tp);
  std::vector<Observed> ranks(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      ThreadTpGroup group(shared, r);
      const parallel::TensorParallelPlan plan(group, sp);
      Model model(cfg, Mode::kCanonical, kMicro, {.plan = &plan});
      run_step(model, tokens, ranks[static_cast<size_t>(r)]);
    });
  }
  for (auto& t : threads) t.join();

  for (const auto& seen : ranks) ASSERT_EQ(seen.order, one.order);
  for (const auto& name : one.order) {
    const auto& [want_shape, want] = one.tensors.at(name);
    const auto& local_shape = ranks[0].tensors.at(name).first;
    const HookShard first = hook_shard(single.desc(), {tp, 0}, sp, name, local_shape);
    EXPECT_EQ(global_hook_shape(first, local_shape), want_shape) << name;
    std::vector<float> global(want.size(), std::nanf(""));
    for (int64_t r = 0; r < tp; ++r) {
      const auto& [shape, data] = ranks[static_cast<size_t>(r)].tensors.at(name);
      ASSERT_EQ(shape, local_shape) << name << " on rank " << r;
      const HookShard s = hook_shard(single.desc(), {tp, r}, sp, name, shape);
      ASSERT_EQ(s.whole(), first.whole()) << name;
      if (s.whole()) {
        expect_bitwise(data, want, name + " (whole) on rank " + std::to_string(r));
      } else {
        place_hook_shard(s, shape, data.data(), global.data());
      }
    }
    if (!first.whole()) expect_bitwise(global, want, name + " gathered");
  }
}

ModelConfig gelu_model() {
  ModelConfig m;
  m.vocab_size = 512;  // every split on 64-element chunks up to tp 4 (canonical mode's condition)
  m.seq_len = 64;
  m.d_model = 256;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  return m;
}

TEST(HookLayout, GatheredHooksOfEveryTpRankAreTheOneDeviceTensors) {
  for (int64_t tp : {2, 4}) {
    for (bool sp : {false, true}) check_layout(gelu_model(), tp, sp);
  }
}

TEST(HookLayout, SwigluGroupedKvRmsnormRope) {
  ModelConfig m = gelu_model();
  m.ffn = FfnKind::kSwiglu;
  m.ffn_hidden = 512;
  m.n_kv_heads = 2;
  m.norm = NormKind::kRmsNorm;
  m.pos = PosKind::kRope;
  m.bias = false;
  m.tie_embeddings = false;
  for (bool sp : {false, true}) check_layout(m, 2, sp);
}

TEST(HookLayout, RefusesNamesTheModelDoesNotObserve) {
  const std::vector<int64_t> shape = {4, 64, 128};
  EXPECT_THROW(hook_shard(describe_model(gelu_model()), {2, 0}, false, "layer/0/attn/proj", shape), InternalError);
  EXPECT_THROW(hook_shard(describe_model(gelu_model()), {2, 0}, false, "layer/0/attn/qkv", shape), InternalError);  // 384 wide
}

}  // namespace
}  // namespace lockstep
