// Gradient clipping (src/optim/grad_clip.hpp), the one implementation every layout calls: the rule
// (below, at and above the limit; off; zero and non-finite norms), the norm of a whole model's
// gradient, a gradient split in two parts as ZeRO-2 splits it (each part with the other's sum: the
// one-process bits), and the clipped step against the reference (src vs reference/gpt.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "src/core/formats.hpp"
#include "src/model/model.hpp"
#include "src/optim/grad_clip.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "tests/support/step_states.hpp"

namespace lockstep {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(ClipScale, OnlyANormAboveThePositiveLimitIsClipped) {
  EXPECT_FALSE(clip_scale(0.5f, 1.0f));
  EXPECT_FALSE(clip_scale(1.0f, 1.0f));  // at the limit: unchanged
  EXPECT_FALSE(clip_scale(0.0f, 1.0f));
  EXPECT_FALSE(clip_scale(100.0f, 0.0f));  // limit 0: clipping off
  EXPECT_FALSE(clip_scale(kNaN, 1.0f));    // NaN: left for the step to report
  ASSERT_TRUE(clip_scale(std::nextafter(1.0f, 2.0f), 1.0f));
  EXPECT_EQ(f32_bits(*clip_scale(4.0f, 1.0f)), f32_bits(1.0f / (4.0f + 1e-6f)));
  EXPECT_EQ(f32_bits(*clip_scale(kInf, 1.0f)), f32_bits(0.0f));
}

ModelConfig clip_model() {
  return {.vocab_size = 40, .seq_len = 8, .d_model = 16, .n_layers = 1, .n_heads = 4, .seed = 1};
}

// A model whose gradient is 3 in the first element of wte and 4 in the last element of the last
// tensor, 0 elsewhere: global norm 5 exactly in either mode.
struct ThreeFour {
  Model model;
  int64_t last;
  explicit ThreeFour(Mode mode) : model(describe_model(clip_model()), mode, 1), last(model.num_params() - 1) {
    model.init_parameters();
    model.zero_grad();
    model.grads()[0] = 3.0f;
    model.grads()[last] = 4.0f;
  }
  bool others_zero() const {
    for (int64_t i = 1; i < last; ++i)
      if (model.grads()[i] != 0.0f) return false;
    return true;
  }
};

TEST(ClipGradNorm, NormOfTheWholeGradientAndTheScaleOnlyAboveTheLimit) {
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    SCOPED_TRACE(mode == Mode::kCanonical ? "canonical" : "fast");
    for (float max_norm : {0.0f, 5.0f, 10.0f}) {
      ThreeFour g(mode);
      EXPECT_EQ(clip_grad_norm(g.model, max_norm), 5.0f);
      EXPECT_EQ(g.model.grads()[0], 3.0f) << "max_norm " << max_norm;
      EXPECT_EQ(g.model.grads()[g.last], 4.0f) << "max_norm " << max_norm;
    }
    ThreeFour g(mode);
    EXPECT_EQ(clip_grad_norm(g.model, 2.5f), 5.0f);  // the norm before clipping
    const float scale = 2.5f / (5.0f + 1e-6f);
    EXPECT_EQ(f32_bits(g.model.grads()[0]), f32_bits(3.0f * scale));
    EXPECT_EQ(f32_bits(g.model.grads()[g.last]), f32_bits(4.0f * scale));
    EXPECT_TRUE(g.others_zero());
  }
}

TEST(ClipGradNorm, ZeroAndNonFiniteGradients) {
  Model zero(describe_model(clip_model()), Mode::kCanonical, 1);
  zero.zero_grad();
  EXPECT_EQ(clip_grad_norm(zero, 1.0f), 0.0f);
  for (int64_t i = 0; i < zero.num_params(); ++i) ASSERT_EQ(f32_bits(zero.grads()[i]), 0u) << i;

  ThreeFour nan(Mode::kCanonical);
  nan.model.grads()[1] = kNaN;
  EXPECT_TRUE(std::isnan(clip_grad_norm(nan.model, 1.0f)));
  EXPECT_EQ(nan.model.grads()[0], 3.0f);  // unscaled
  EXPECT_EQ(nan.model.grads()[nan.last], 4.0f);

  ThreeFour inf(Mode::kCanonical);
  inf.model.grads()[1] = kInf;
  EXPECT_EQ(clip_grad_norm(inf.model, 1.0f), kInf);
  EXPECT_EQ(f32_bits(inf.model.grads()[0]), f32_bits(0.0f));  // scaled by 0
  EXPECT_TRUE(std::isnan(inf.model.grads()[1]));     // inf · 0
}

// Two parts cut at a chunk start inside a tensor, as make_shard_plan cuts ZeRO-2 shards: each part
// clipped with the sum of both parts' combiners gives the one-process norm and bits.
TEST(ClipGradNorm, TwoPartsWithEachOthersSumGiveTheOneProcessBits) {
  Model whole(describe_model(clip_model()), Mode::kCanonical, 1);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < whole.num_params(); ++i) whole.grads()[i] = normal(rng);
  std::vector<float> split(whole.grads(), whole.grads() + whole.num_params());
  const int64_t n = whole.num_params();
  const int64_t cut = parallel::first_valid_cut(whole.param_layout(), n / 2 + 1);
  ASSERT_GT(cut, 0);
  ASSERT_LT(cut, n);
  const GradPart lower{0, cut, split.data()}, upper{cut, n, split.data() + cut};

  ChunkCombiner lower_sum, upper_sum;
  const auto capture = [](ChunkCombiner& into) {
    return [&into](const ChunkCombiner& own) {
      into = own;
      return 0.0f;
    };
  };
  clip_grad_norm(whole, lower, 0.0f, capture(lower_sum));  // limit 0: the sums only, no scaling
  clip_grad_norm(whole, upper, 0.0f, capture(upper_sum));
  const auto with = [](const ChunkCombiner& other) {
    return [&other](const ChunkCombiner& own) {
      float terms[parallel::kCombinerTerms];
      parallel::combiner_terms(other, terms);
      ChunkCombiner sum = own;
      for (float t : terms) sum.add(t);
      return sum.finish();
    };
  };
  const float max_norm = 1.0f;
  const float lower_norm = clip_grad_norm(whole, lower, max_norm, with(upper_sum));
  const float upper_norm = clip_grad_norm(whole, upper, max_norm, with(lower_sum));
  const float norm = clip_grad_norm(whole, max_norm);
  ASSERT_GT(norm, max_norm);
  EXPECT_EQ(f32_bits(lower_norm), f32_bits(norm));
  EXPECT_EQ(f32_bits(upper_norm), f32_bits(norm));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f32_bits(split[static_cast<size_t>(i)]), f32_bits(whole.grads()[i])) << i;
}

// The whole step's clip and AdamW update against the reference (CanonicalF32 bitwise, Bounded<mpfr>
// in fast mode), in the clipping regime and below it.
verify::StepState step_with_clip(Mode mode, double grad_clip) {
  verify::StepState s = tiny_state(mode, false);
  s.cfg.train.grad_clip = grad_clip;
  return s;
}

TEST(ClipGradNorm, StepAboveAndBelowTheLimitMatchesTheReference) {
  verify::StepOptions fast;
  fast.reference_bits = 128;
  for (double limit : {0.5, 1e4, 0.0}) {
    SCOPED_TRACE(testing::Message() << "grad_clip " << limit);
    const verify::StepReport canonical = verify::verify_step(step_with_clip(Mode::kCanonical, limit), {});
    const bool clipped = canonical.grad_norm > limit && limit > 0;
    EXPECT_EQ(clipped, limit == 0.5) << "grad norm " << canonical.grad_norm;
    expect_verify_pass(canonical);
    expect_verify_pass(verify::verify_step(step_with_clip(Mode::kFast, limit), fast));
  }
}

}  // namespace
}  // namespace lockstep
