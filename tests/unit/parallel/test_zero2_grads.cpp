// ZeRO-2 gradient staging without ranks (one "rank" owning the whole shard):
//  - plan_grad_buckets with whole_tensors cuts only between tensors;
//  - a BucketScheduler that completes buckets in every micro-batch restarts their count, and with
//    every_micro_batch reduces each at once without a worker;
//  - a model writing through Zero2Grads, each complete bucket "reduced" by adding its staging into
//    the shard as data parallelism does, gives bitwise the model's own gradient: canonical mode
//    (the shard's exact sums over micro-batches, rounded once) against the own buffers' one
//    rounding; fast mode against the fp32 sum, micro-batch by micro-batch, of the own buffers'
//    per-micro-batch gradients; tied and untied embeddings (a tied wte's bucket stays open from
//    the head to the embedding), on the worker and without one, with buckets from one tensor to all;
//  - the staging pool never holds more than its budget, and a budget no bucket order can live with
//    is a ConfigError naming the bucket.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "src/core/check.hpp"
#include "src/model/model.hpp"
#include "src/parallel/grad_buckets.hpp"
#include "tests/unit/parallel/small_model.hpp"
#include "src/parallel/zero2_grads.hpp"

namespace lockstep::parallel {
namespace {

TEST(Zero2Buckets, WholeTensorsCutOnlyBetweenTensors) {
  const auto layout = build_param_layout(small_model(true));
  const int64_t n = layout.back().offset + layout.back().numel;
  for (int64_t elems : {int64_t{1}, int64_t{100}, int64_t{3000}, n}) {
    const auto buckets = plan_grad_buckets(layout, elems, false, true);
    ASSERT_EQ(buckets.back().end, n);
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (b > 0) {
        EXPECT_EQ(buckets[b].first, buckets[b - 1].end);
      }
      const bool at_tensor_end = std::any_of(layout.begin(), layout.end(),
                                             [&](const ParamTensor& t) { return t.offset + t.numel == buckets[b].end; });
      EXPECT_TRUE(at_tensor_end) << "bucket " << b << " ends inside a tensor";
    }
    if (elems == 1) {
      EXPECT_EQ(buckets.size(), layout.size());  // one tensor each
    }
  }
}

TEST(Zero2Buckets, SchedulerRestartsACompletedBucketAndReducesEagerly) {
  const std::vector<GradBucket> buckets = {{0, 10}, {10, 20}};
  std::vector<int> count(2, 0), completed(2, 0);
  BucketScheduler s(
      buckets, [&](const GradBucket& b) { count[static_cast<size_t>(b.first / 10)] += 1; }, false, true,
      [&](size_t b) { completed[b] += 1; });
  for (int micro = 1; micro <= 3; ++micro) {
    s.mark_ready(0, 20);
    EXPECT_EQ(count[0], micro);  // at once, without a worker
    EXPECT_EQ(count[1], micro);
    EXPECT_EQ(completed[0], micro);
  }
  s.finish();  // everything was reduced: nothing more
  EXPECT_EQ(count[0], 3);
  EXPECT_EQ(count[1], 3);
}

// A step of `micro` micro-batches of one sequence through Zero2Grads (the whole buffer is the
// shard), each complete bucket added to the shard; returns the shard after finish_shard().
std::vector<float> staged_step(const ModelConfig& cfg, Mode mode, int64_t micro, int64_t bucket_elems, bool threaded,
                               const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
  Model gpt(cfg, mode, 1);
  gpt.init_parameters();
  const int64_t n = gpt.num_params(), T = cfg.seq_len;
  auto buckets = plan_grad_buckets(gpt.param_layout(), bucket_elems, false, true);
  std::vector<int64_t> sizes;
  for (const auto& b : buckets) sizes.push_back(b.size());
  std::sort(sizes.rbegin(), sizes.rend());
  const int64_t budget = sizes[0] + 3 * (sizes.size() > 1 ? sizes[1] : 0);  // as DataParallel's
  Zero2Grads z(gpt.param_layout(), buckets, mode, 0, n, mode == Mode::kCanonical, false, budget);
  gpt.set_grad_storage(&z);
  EXPECT_EQ(gpt.grads(), nullptr);
  EXPECT_EQ(gpt.grad_bytes(), 0u);
  std::vector<GradBucket> plan = buckets;
  BucketScheduler s(
      buckets,
      [&](const GradBucket& b) {
        const auto k = static_cast<size_t>(
            std::find_if(plan.begin(), plan.end(), [&](const GradBucket& x) { return x.first == b.first; }) -
            plan.begin());
        const GradSink g = z.staged(k);
        for (int64_t i = 0; i < b.size(); ++i) {
          const auto j = static_cast<size_t>(g.offset + i), at = static_cast<size_t>(b.first + i);
          if (g.exact && g.exact->spilled(j)) {
            z.shard_exact().add(at, g.exact->spill(j));
          } else if (g.exact) {
            z.shard_exact().add(at, g.exact->partial_sums()[j]);
          } else {
            z.shard()[b.first + i] += g.f32[i];
          }
        }
        z.release(k);
      },
      threaded, true, [&](size_t b) { z.close(b); });
  gpt.set_grad_ready_hook([&](int64_t first, int64_t end, bool) { s.mark_ready(first, end); });
  gpt.zero_grad();
  ChunkCombiner loss;
  gpt.forward_backward_batch(inputs.data(), targets.data(), micro, 1, 0, 1.0f / static_cast<float>(micro * T), loss);
  s.finish();
  z.finish_shard();
  // The pool stays within its budget: shard bytes plus at most `budget` staged elements.
  const bool exact = mode == Mode::kCanonical;
  const uint64_t elem = exact ? sizeof(double) + 1 : sizeof(float);
  EXPECT_LE(z.bytes(), static_cast<uint64_t>(n) * (sizeof(float) + (exact ? elem : 0)) + static_cast<uint64_t>(budget) * elem);
  std::vector<float> out(z.shard(), z.shard() + n);
  gpt.set_grad_ready_hook({});
  gpt.set_grad_storage(nullptr);
  return out;
}

// The model's own buffers: canonical, the whole step rounded once; fast, each micro-batch's
// gradient added in fp32 in micro-batch order (what the staged shard does).
std::vector<float> own_step(const ModelConfig& cfg, Mode mode, int64_t micro, const std::vector<int32_t>& inputs,
                            const std::vector<int32_t>& targets) {
  Model gpt(cfg, mode, 1);
  gpt.init_parameters();
  const int64_t n = gpt.num_params(), T = cfg.seq_len;
  const float dloss = 1.0f / static_cast<float>(micro * T);
  ChunkCombiner loss;
  if (mode == Mode::kCanonical) {
    gpt.zero_grad();
    gpt.forward_backward_batch(inputs.data(), targets.data(), micro, 1, 0, dloss, loss);
    gpt.finish_grads();
    return {gpt.grads(), gpt.grads() + n};
  }
  std::vector<float> sum(static_cast<size_t>(n), 0.0f);
  for (int64_t m = 0; m < micro; ++m) {
    gpt.zero_grad();
    gpt.forward_backward(inputs.data() + m * T, targets.data() + m * T, 1, m * T, dloss, loss);
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += gpt.grads()[i];
  }
  return sum;
}

TEST(Zero2Grads, StagedBucketsGiveTheModelsOwnGradient) {
  const int64_t micro = 3;
  std::mt19937 gen(11);
  const ModelConfig base = small_model(true);
  std::vector<int32_t> inputs(static_cast<size_t>(micro * base.seq_len)), targets(inputs.size());
  for (auto& x : inputs) x = static_cast<int32_t>(gen() % 90);
  for (auto& x : targets) x = static_cast<int32_t>(gen() % 90);
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (bool tied : {true, false}) {
      const ModelConfig cfg = small_model(tied);
      const std::vector<float> want = own_step(cfg, mode, micro, inputs, targets);
      for (int64_t elems : {int64_t{1}, int64_t{2000}, int64_t{1} << 30}) {
        for (bool threaded : {false, true}) {
          SCOPED_TRACE(testing::Message() << mode_name(mode) << " tied " << tied << " buckets of " << elems
                                          << " elements, threaded " << threaded);
          const std::vector<float> got = staged_step(cfg, mode, micro, elems, threaded, inputs, targets);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                << "element " << i << ": " << got[i] << " vs " << want[i];
          }
        }
      }
    }
  }
}

TEST(Zero2Grads, ABudgetBelowTheBackwardsNeedIsAConfigError) {
  const ModelConfig cfg = small_model(true);
  Model gpt(cfg, Mode::kFast, 1);
  gpt.init_parameters();
  const auto buckets = plan_grad_buckets(gpt.param_layout(), 1, false, true);
  int64_t largest = 0;
  for (const auto& b : buckets) largest = std::max(largest, b.size());
  // Room for the largest bucket alone: the tied wte's bucket stays open while the head's and the
  // layers' buckets need staging too, and with no reduction in flight nothing comes back.
  Zero2Grads z(gpt.param_layout(), buckets, Mode::kFast, 0, gpt.num_params(), false, false, largest);
  gpt.set_grad_storage(&z);
  const std::vector<int32_t> tokens(static_cast<size_t>(cfg.seq_len), 1);
  ChunkCombiner loss;
  gpt.zero_grad();
  try {
    gpt.forward_backward(tokens.data(), tokens.data(), 1, 0, 1.0f, loss);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("staging budget of " + std::to_string(largest) + " elements"), std::string::npos)
        << e.what();
  }
  gpt.set_grad_storage(nullptr);
}

}  // namespace
}  // namespace lockstep::parallel
