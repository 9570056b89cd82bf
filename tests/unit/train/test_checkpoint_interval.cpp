// Tests of the checkpoint interval (src/train/checkpoint_interval.hpp) against the formulas it
// states, and of the optimum being one: the expected wall time per unit of work with exponential
// failures and no restart cost, M·(e^((τ+δ)/M) − 1)/τ (Daly 2006), is no smaller a tenth either
// side of Daly's τ.
#include <gtest/gtest.h>

#include <cmath>

#include "src/train/checkpoint_interval.hpp"

namespace lockstep {
namespace {

TEST(CheckpointInterval, DalyFormulaAndItsLimits) {
  // δ = 10 s, M = 24 h: √(2δM) = 1314.5 s, and Daly's terms add 0.52% (δ/2M = 5.8e-5).
  const double d = 10, m = 24 * 3600.0;
  const double young = std::sqrt(2 * d * m);
  const double r = d / (2 * m);
  EXPECT_DOUBLE_EQ(daly_interval_s(d, m), young * (1 + std::sqrt(r) / 3 + r / 9) - d);
  EXPECT_NEAR(daly_interval_s(d, m), young, d);  // to first order, Young's
  EXPECT_EQ(daly_interval_s(3 * m, m), m);                  // a save longer than 2M: M
  EXPECT_EQ(checkpoint_interval_steps(d, m, 0.5), std::llround(daly_interval_s(d, m) / 0.5));
  EXPECT_EQ(checkpoint_interval_steps(1e-6, 1.0, 1e6), 1);  // never below one step
}

TEST(CheckpointInterval, IsTheMinimumOfTheTimeLost) {
  for (double d : {0.1, 2.0, 60.0}) {
    for (double m : {600.0, 24 * 3600.0}) {
      const auto lost = [&](double tau) { return m * std::expm1((tau + d) / m) / tau; };
      const double t = daly_interval_s(d, m);
      EXPECT_LT(lost(t), lost(0.9 * t)) << d << " " << m;
      EXPECT_LT(lost(t), lost(1.1 * t)) << d << " " << m;
    }
  }
}

}  // namespace
}  // namespace lockstep
