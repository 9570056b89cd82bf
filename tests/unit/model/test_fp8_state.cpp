// The fp8 recipe's state (src/model/fp8_state.hpp): delayed scaling takes each step's amax into a
// history of amax_history_len steps and derives the next scale from its maximum (or most recent
// entry) with the margin; a step's records accumulate (max, sums) until finish_step; the combined
// statistics replace the local ones; save/restore round-trips every bit (NaN and inf included) and
// refuses a state of another recipe or model. And the recipe's quantization shapes per GEMM.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/fp8_state.hpp"

namespace lockstep {
namespace {

Fp8Recipe delayed(int64_t len, bool max_algo, int64_t margin = 0) {
  Fp8Recipe r;
  r.scaling = Fp8Scaling::kDelayed;
  r.amax_history_len = len;
  r.amax_max = max_algo;
  r.margin = margin;
  return r;
}

// One step in which tensor i met `amax`.
void step(Fp8State& s, size_t i, float amax) {
  s.record(i, Fp8Counts{.amax = amax, .nonzero = 1}, 1);
  s.finish_step();
}

TEST(Fp8State, TensorsOfEachLinearInRoleOrder) {
  const Fp8State s(delayed(4, true), {"layer/0/mlp/fc", "head"});
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s.name(0), "layer/0/mlp/fc/input");
  EXPECT_EQ(s.name(1), "layer/0/mlp/fc/weight");
  EXPECT_EQ(s.name(2), "layer/0/mlp/fc/grad_output");
  EXPECT_EQ(s.index("head", Fp8Role::kWeight), 4u);
  EXPECT_EQ(s.scale(0), 1.0f);  // before any history
}

TEST(Fp8State, DelayedScalingFollowsTheHistoryMaximum) {
  Fp8State s(delayed(3, true), {"l"});
  const size_t in = s.index("l", Fp8Role::kInput), grad = s.index("l", Fp8Role::kGradOutput);
  step(s, in, 4.0f);
  EXPECT_EQ(s.scale(in), 448.0f / 4.0f);
  step(s, in, 2.0f);
  EXPECT_EQ(s.scale(in), 448.0f / 4.0f);  // 4 is still in the history
  step(s, in, 1.0f);
  step(s, in, 1.0f);                      // 4 has left a history of 3
  EXPECT_EQ(s.scale(in), 448.0f / 2.0f);
  step(s, in, 0.5f);
  EXPECT_EQ(s.scale(in), 448.0f / 1.0f);
  step(s, in, 8.0f);  // the newest is the largest: it rules at once
  EXPECT_EQ(s.scale(in), 448.0f / 8.0f);
  // The gradient is e5m2 (hybrid); a step without records keeps the scale (amax 0).
  EXPECT_EQ(s.scale(grad), 1.0f);
}

TEST(Fp8State, MostRecentAndMargin) {
  Fp8State s(delayed(16, false, 2), {"l"});
  step(s, 0, 8.0f);
  step(s, 0, 2.0f);
  EXPECT_EQ(s.scale(0), 448.0f / 2.0f / 4.0f);
  // A non-finite amax keeps the scale (and, in the history, until it leaves it).
  step(s, 0, INFINITY);
  EXPECT_EQ(s.scale(0), 448.0f / 2.0f / 4.0f);
}

TEST(Fp8State, RecordsOfAStepAccumulateAndCombinedOnesReplaceThem) {
  Fp8State s(delayed(4, true), {"l"});
  s.record(0, Fp8Counts{.amax = 3.0f, .saturated = 1, .underflowed = 2, .nonzero = 10}, 12);
  s.record(0, Fp8Counts{.amax = 5.0f, .saturated = 0, .underflowed = 1, .nonzero = 6}, 6);
  EXPECT_EQ(s.step_amax()[0], 5.0f);
  const std::vector<double> counts = s.step_counts();
  EXPECT_EQ(counts[0], 18.0);  // numel
  EXPECT_EQ(counts[1], 1.0);   // saturated
  EXPECT_EQ(counts[2], 3.0);   // underflowed
  EXPECT_EQ(counts[3], 16.0);  // nonzero
  // Another rank's part, combined: the state derives the scale from the combined amax.
  std::vector<float> amax = s.step_amax();
  amax[0] = 7.0f;
  s.set_step_stats(amax, counts);
  s.finish_step();
  EXPECT_EQ(s.scale(0), 448.0f / 7.0f);
  EXPECT_DOUBLE_EQ(s.step_stats(0).underflow_fraction(), 3.0 / 16.0);
  // The next record starts a new step.
  s.record(0, Fp8Counts{.amax = 1.0f, .nonzero = 1}, 1);
  EXPECT_EQ(s.step_counts()[0], 1.0);
}

TEST(Fp8State, SaveRestoreKeepsEveryBit) {
  Fp8State a(delayed(8, true), {"x", "y"});
  step(a, 0, 3.0f);
  step(a, 3, 0x1p-140f);  // a scale that overflows to the largest float
  step(a, 4, NAN);
  Fp8State b(delayed(8, true), {"x", "y"});
  b.restore(a.save());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(a.scale(i)), std::bit_cast<uint32_t>(b.scale(i)));
  step(a, 0, 1.0f);
  step(b, 0, 1.0f);
  EXPECT_EQ(a.scale(0), b.scale(0));  // the history came along: 3 still rules
  EXPECT_EQ(b.scale(0), 448.0f / 3.0f);

  Fp8Recipe current = delayed(8, true);
  current.scaling = Fp8Scaling::kCurrent;
  Fp8State other_recipe(current, {"x", "y"});
  EXPECT_THROW(other_recipe.restore(a.save()), std::runtime_error);
  Fp8State other_model(delayed(8, true), {"x"});
  EXPECT_THROW(other_model.restore(a.save()), std::runtime_error);
}

TEST(Fp8Recipe, BlocksFollowEachGemmsReducedDimension) {
  Fp8Recipe mx;
  mx.scaling = Fp8Scaling::kMxfp8;
  const QuantizeShape row = mx.shape(Fp8Role::kInput, Fp8Direction::kRowwise, 64, 256, 1.0f);
  EXPECT_EQ(row.scaling, Fp8Scale::kPowerOfTwo);
  EXPECT_EQ(row.block_rows, 1);
  EXPECT_EQ(row.block_cols, 32);
  const QuantizeShape col = mx.shape(Fp8Role::kGradOutput, Fp8Direction::kColumnwise, 64, 256, 1.0f);
  EXPECT_EQ(col.block_rows, 32);
  EXPECT_EQ(col.block_cols, 1);
  EXPECT_EQ(col.format, Fp8Format::kE5M2);

  Fp8Recipe blockwise;
  blockwise.scaling = Fp8Scaling::kBlockwise;
  const QuantizeShape w = blockwise.shape(Fp8Role::kWeight, Fp8Direction::kColumnwise, 256, 256, 1.0f);
  EXPECT_EQ(w.scaling, Fp8Scale::kFp32);
  EXPECT_EQ(w.block_rows, 128);
  EXPECT_EQ(w.block_cols, 128);
  blockwise.hybrid = false;
  EXPECT_EQ(blockwise.shape(Fp8Role::kGradOutput, Fp8Direction::kRowwise, 8, 128, 1.0f).format, Fp8Format::kE4M3);

  Fp8Recipe per_tensor;
  const QuantizeShape t = per_tensor.shape(Fp8Role::kInput, Fp8Direction::kColumnwise, 8, 8, 0.25f);
  EXPECT_EQ(t.scaling, Fp8Scale::kPerTensor);
  EXPECT_EQ(t.scale, 0.25f);
}

}  // namespace
}  // namespace lockstep
