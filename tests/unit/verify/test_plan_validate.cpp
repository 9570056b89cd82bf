// The validation's row of a layout from its rounds (verify/plan_validate.hpp): a prediction only
// beside the run it was timed for, the median round's, so that one round whose machine state
// changed between its passes and its run does not decide the row.
#include <gtest/gtest.h>

#include <vector>

#include "src/core/check.hpp"
#include "verify/plan_validate.hpp"

namespace lockstep::verify {
namespace {

// A round: predicted and measured step time in ms, the measured peak in MiB.
Validation round(double predicted_ms, double measured_ms, double peak_mib) {
  Validation v;
  v.predicted.time.total = predicted_ms / 1e3;
  v.predicted.memory.activations = 100.0 * (1 << 20);
  v.measured.step_s = measured_ms / 1e3;
  v.measured.peak_bytes = peak_mib * (1 << 20);
  return v;
}

TEST(PlanValidate, RowIsTheMedianRoundsPairWithTheLargestPeak) {
  // Round two's run fell into a slow state after its passes were timed: +33% from the others' pair.
  const std::vector<Validation> rounds = {round(100, 104, 90), round(140, 105, 96), round(102, 100, 93)};
  const Validation row = median_round(rounds);
  EXPECT_DOUBLE_EQ(row.predicted.time.total, 0.102);
  EXPECT_DOUBLE_EQ(row.measured.step_s, 0.100);
  EXPECT_NEAR(row.step_error(), 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(row.measured.peak_bytes, 96.0 * (1 << 20));
  ASSERT_EQ(row.round_step_errors.size(), 3u);
  for (size_t i = 0; i < rounds.size(); ++i) EXPECT_DOUBLE_EQ(row.round_step_errors[i], rounds[i].step_error());
}

TEST(PlanValidate, EvenRoundsTakeTheLowerMiddleAndOneRoundIsItself) {
  const Validation two = median_round({round(120, 100, 90), round(90, 100, 90)});
  EXPECT_NEAR(two.step_error(), -0.10, 1e-12);
  const Validation one = median_round({round(120, 100, 90)});
  EXPECT_NEAR(one.step_error(), 0.20, 1e-12);
  ASSERT_EQ(one.round_step_errors.size(), 1u);
  EXPECT_THROW(median_round({}), InternalError);
  EXPECT_EQ(signed_percent(two.step_error()), "-10.0%");
  EXPECT_EQ(signed_percent(one.step_error()), "+20.0%");
}

}  // namespace
}  // namespace lockstep::verify
