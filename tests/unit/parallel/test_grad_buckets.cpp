// Gradient buckets without ranks:
//  - plan_grad_buckets tiles the buffer with buckets that end on valid shard cuts, of one chunk
//    when asked for less, of the whole buffer when asked for more, never mixing norm and other
//    tensors with split_norms;
//  - the model's grad-ready hook reports every element once per micro-batch, in the documented
//    order, and in the last micro-batch each range is final when reported (its values then are
//    the step's gradient), for tied and untied heads, learned and rotary positions, canonical and
//    fast mode;
//  - BucketScheduler reduces every bucket once per step, on its worker or in finish().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "src/core/check.hpp"
#include "src/model/model.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/grad_buckets.hpp"
#include "tests/unit/parallel/small_model.hpp"

namespace lockstep::parallel {
namespace {

int64_t buffer_size(const std::vector<ParamTensor>& layout) { return layout.back().offset + layout.back().numel; }

void expect_tiling(const std::vector<GradBucket>& buckets, const std::vector<ParamTensor>& layout) {
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().first, 0);
  EXPECT_EQ(buckets.back().end, buffer_size(layout));
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_LT(buckets[b].first, buckets[b].end) << "bucket " << b;
    if (b > 0) {
      EXPECT_EQ(buckets[b].first, buckets[b - 1].end) << "bucket " << b;
    }
    EXPECT_EQ(first_valid_cut(layout, buckets[b].end), buckets[b].end) << "bucket " << b << " ends off a valid cut";
  }
}

TEST(GradBuckets, TileTheBufferOnValidCuts) {
  const auto layout = build_param_layout(small_model(false, PosKind::kLearned));
  const int64_t n = buffer_size(layout);
  for (int64_t elems : {int64_t{1}, int64_t{100}, int64_t{1000}, n / 3, n, 10 * n}) {
    SCOPED_TRACE(elems);
    const auto buckets = plan_grad_buckets(layout, elems, false);
    expect_tiling(buckets, layout);
    for (const auto& b : buckets) {
      // At least the asked size (or a tensor's end), and never a chunk more than the next cut.
      const bool at_tensor_end = std::any_of(layout.begin(), layout.end(),
                                             [&](const ParamTensor& t) { return t.offset + t.numel == b.end; });
      EXPECT_TRUE(b.size() >= elems || at_tensor_end) << b.first << ".." << b.end;
      EXPECT_LT(b.size(), std::max<int64_t>(elems, 1) + kCanonicalChunk) << b.first << ".." << b.end;
    }
  }
  EXPECT_EQ(plan_grad_buckets(layout, 10 * n, false).size(), 1u);
  // Asked for less than a chunk: one chunk (or a tensor's remainder) per bucket.
  for (const auto& b : plan_grad_buckets(layout, 1, false)) EXPECT_LE(b.size(), kCanonicalChunk);
}

TEST(GradBuckets, GivenCutsAreBucketEnds) {
  const auto layout = build_param_layout(small_model(false, PosKind::kLearned));
  const int64_t cuts[] = {layout[3].offset, layout[7].offset};  // two chunks' starts
  for (bool whole : {false, true}) {
    for (int64_t elems : {int64_t{100}, buffer_size(layout)}) {
      const auto buckets = plan_grad_buckets(layout, elems, false, whole, cuts);
      expect_tiling(buckets, layout);
      for (const auto& b : buckets) {
        for (int64_t c : cuts) EXPECT_FALSE(b.first < c && c < b.end) << "bucket " << b.first << ".." << b.end << " spans " << c;
      }
    }
  }
}

TEST(GradBuckets, SplitNormsKeepsNormTensorsApart) {
  const auto layout = build_param_layout(small_model(true, PosKind::kRope));
  for (int64_t elems : {int64_t{64}, int64_t{5000}, buffer_size(layout)}) {
    const auto buckets = plan_grad_buckets(layout, elems, true);
    expect_tiling(buckets, layout);
    for (const auto& b : buckets) {
      int norm = 0, other = 0;
      for (const auto& t : layout) {
        if (t.offset < b.end && b.first < t.offset + t.numel) (t.is_norm() ? norm : other) += 1;
      }
      EXPECT_TRUE(norm == 0 || other == 0) << "bucket " << b.first << ".." << b.end << " mixes norm and others";
    }
  }
}

// Runs a step of `micro` micro-batches with the grad-ready hook on; checks coverage, order and
// that each range's values when reported are its final values.
void check_hook(const ModelConfig& cfg, Mode mode, int64_t micro) {
  Model gpt(cfg, mode, 1);
  gpt.init_parameters();
  const int64_t T = cfg.seq_len, n = gpt.num_params();
  std::mt19937 gen(7);
  std::vector<int32_t> inputs(static_cast<size_t>(micro * T)), targets(inputs.size());
  for (auto& x : inputs) x = static_cast<int32_t>(gen() % 90);
  for (auto& x : targets) x = static_cast<int32_t>(gen() % 90);
  auto value = [&](int64_t i) {
    return mode == Mode::kCanonical ? gpt.exact_grads().round(static_cast<size_t>(i)) : gpt.grads()[i];
  };
  std::vector<int> reported(static_cast<size_t>(n), 0), reported_last(static_cast<size_t>(n), 0);
  std::vector<float> at_report(static_cast<size_t>(n));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  gpt.set_grad_ready_hook([&](int64_t first, int64_t end, bool last) {
    for (int64_t i = first; i < end; ++i) reported[static_cast<size_t>(i)] += 1;
    if (!last) return;
    ranges.emplace_back(first, end);
    for (int64_t i = first; i < end; ++i) {
      reported_last[static_cast<size_t>(i)] += 1;
      at_report[static_cast<size_t>(i)] = value(i);
    }
  });
  gpt.zero_grad();
  ChunkCombiner loss;
  gpt.forward_backward_batch(inputs.data(), targets.data(), micro, 1, 0, 1.0f / static_cast<float>(micro * T), loss);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(reported[static_cast<size_t>(i)], micro) << "element " << i << " reported that many times";
    ASSERT_EQ(reported_last[static_cast<size_t>(i)], 1) << "element " << i << " reported that many times last";
    const float now = value(i), then = at_report[static_cast<size_t>(i)];
    ASSERT_EQ(std::memcmp(&now, &then, sizeof now), 0) << "element " << i << " changed after it was reported";
  }
  // Order: the buffer from its end down (head, lnf, layers L-1 .. 0), the embeddings last.
  const auto& layout = gpt.param_layout();
  const int64_t embed_end = layout[cfg.pos == PosKind::kLearned ? 1 : 0].offset +
                            layout[cfg.pos == PosKind::kLearned ? 1 : 0].numel;
  ASSERT_EQ(ranges.back(), std::make_pair(int64_t{0}, embed_end));
  for (size_t k = 1; k + 1 < ranges.size(); ++k) EXPECT_EQ(ranges[k].second, ranges[k - 1].first) << "range " << k;
  EXPECT_EQ(ranges.front().second, n);
  // Without the batch driver (a lone forward_backward), every element is reported, not as last.
  ranges.clear();
  std::fill(reported.begin(), reported.end(), 0);
  gpt.forward_backward(inputs.data(), targets.data(), 1, 0, 1.0f, loss);
  EXPECT_TRUE(ranges.empty());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(reported[static_cast<size_t>(i)], 1) << "element " << i;
}

TEST(GradReadyHook, ReportsEveryElementOnceWhenFinal) {
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (bool tied : {true, false}) {
      for (PosKind pos : {PosKind::kLearned, PosKind::kRope}) {
        SCOPED_TRACE(testing::Message() << mode_name(mode) << " tied " << tied << " pos " << pos_name(pos));
        check_hook(small_model(tied, pos), mode, 3);
      }
    }
  }
}

TEST(BucketScheduler, ReducesEveryBucketOncePerStep) {
  const std::vector<GradBucket> buckets = {{0, 10}, {10, 20}, {20, 35}};
  for (bool threaded : {true, false}) {
    std::vector<std::atomic<int>> count(buckets.size());
    BucketScheduler s(buckets, [&](const GradBucket& b) { count[static_cast<size_t>(b.first / 10)] += 1; }, threaded);
    EXPECT_EQ(s.threaded(), threaded);
    for (int step = 1; step <= 2; ++step) {
      s.mark_ready(15, 35);  // bucket 2 complete, bucket 1 half
      s.mark_ready(5, 10);   // bucket 0 half
      s.finish();            // the rest
      for (size_t b = 0; b < buckets.size(); ++b) EXPECT_EQ(count[b].load(), step) << "bucket " << b;
      EXPECT_EQ(s.last_step().transfers, 3);
    }
    s.mark_ready(0, 10);
    EXPECT_THROW(s.mark_ready(0, 10), InternalError);  // reported twice in one step
  }
}

}  // namespace
}  // namespace lockstep::parallel
