// The reference's own schedule and bias corrections (reference/schedule.hpp): exact values where
// the formula gives them, and agreement bit for bit with the trainer's (src/optim/adamw.hpp) over
// whole runs, which is what lets canonical verify step compare the hyper/ rows bitwise.
#include <gtest/gtest.h>


#include "reference/schedule.hpp"
#include "src/core/formats.hpp"
#include "src/optim/adamw.hpp"

namespace lockstep {
namespace {

TEST(ReferenceSchedule, ExactAtWarmupCosineMidpointAndEnd) {
  const reference::ScheduleSpec s{.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .steps = 111};
  EXPECT_EQ(reference::schedule_lr_exact(s, 4), reference::Mpfr(1e-3) * 5 / 10);
  EXPECT_EQ(reference::schedule_lr_exact(s, 10), reference::Mpfr(1e-3));  // cos 0
  // cos(π/2) and cos(π) of a 128-bit π: 0 and −1 to far below fp32's resolution.
  const auto f32 = [](const reference::Mpfr& x) { return f32_bits(reference::to_f32(x)); };
  EXPECT_EQ(f32(reference::schedule_lr_exact(s, 60)), f32((reference::Mpfr(1e-3) + reference::Mpfr(1e-4)) / 2));
  EXPECT_EQ(f32(reference::schedule_lr_exact(s, 110)), f32(reference::Mpfr(1e-4)));
  EXPECT_EQ(f32(reference::schedule_lr_exact(s, 500)), f32(reference::Mpfr(1e-4)));  // past the end
  EXPECT_EQ(reference::schedule_lr_exact({.lr = 2e-3, .min_lr = 0, .warmup = 3, .steps = 4}, 3),
            reference::Mpfr(2e-3));  // one step after warm-up: lr
}

TEST(ReferenceSchedule, TrainersScheduleAndBiasCorrectionsAreTheRoundedExactValues) {
  for (const reference::ScheduleSpec& s : {reference::ScheduleSpec{3e-4, 3e-5, 100, 5000},
                                           reference::ScheduleSpec{1e-2, 0, 0, 777}}) {
    const LrSchedule trainer{s.lr, s.min_lr, s.warmup, s.steps};
    for (int64_t step = 0; step < s.steps; ++step) {
      ASSERT_EQ(f32_bits(static_cast<float>(trainer.at(step))), f32_bits(reference::to_f32(reference::schedule_lr_exact(s, step))))
          << "step " << step << " of " << s.steps;
    }
  }
  for (float beta : {0.9f, 0.95f, 0.98f, 0.999f}) {
    for (int64_t t = 1; t <= 5000; ++t) {
      ASSERT_EQ(f32_bits(adamw_bias_correction(beta, t)), f32_bits(reference::to_f32(reference::bias_correction_exact(beta, t))))
          << "beta " << beta << " t " << t;
    }
  }
}

TEST(ReferenceSchedule, DecayedClassesFromTheConfigsList) {
  using C = std::array<bool, kNumParamClasses>;
  EXPECT_EQ(reference::decayed_classes("matrices,embeddings"), (C{true, true, false, false}));
  EXPECT_EQ(reference::decayed_classes("biases,norms"), (C{false, false, true, true}));
  EXPECT_EQ(reference::decayed_classes("none"), (C{}));
  EXPECT_EQ(reference::decayed_classes(""), (C{}));
}

}  // namespace
}  // namespace lockstep
