// The numeric detectors and the finding log (verify/detect/): the robust z-score on known
// histories, the window's warm-up and its refusal of non-finite values, a finding's line and JSON
// record, the actions (warn goes on, stop throws FaultStop with the class's exit code), a jump right
// after a fast descent found, no false alarm over 10,000 steps of a noisy, decaying loss and
// gradient norm, and the state-at-rest check.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "src/comm/communicator.hpp"
#include "tests/support/errors.hpp"
#include "verify/detect/finding.hpp"
#include "verify/detect/nonfinite.hpp"
#include "verify/detect/spikes.hpp"
#include "verify/detect/state_at_rest.hpp"

namespace lockstep::detect {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(JumpZ, RecentLevelAndTheScaleOfStepToStepChanges) {
  // Differences 1, 3, 1, 3, ...: median 2, deviations all 1, MAD 1 (step scale 1.4826 / √2); the
  // last 3, {17, 18, 21}: level 18, deviations 1, 0, 3, MAD 1 — the larger scale, 1.4826, holds.
  const std::vector<double> steady = {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21};
  EXPECT_DOUBLE_EQ(jump_z(steady, 30, 3, 1e-3), (30 - 18) / 1.4826);
  EXPECT_DOUBLE_EQ(jump_z(steady, 18, 3, 1e-3), 0);
  EXPECT_LT(jump_z(steady, 10, 3, 1e-3), 0);  // below the level: negative
  // Alternating 0, 1: differences ±1 (median 0, MAD 1); the last value alone has no spread, so
  // the step scale holds.
  const std::vector<double> alternating = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
  EXPECT_DOUBLE_EQ(jump_z(alternating, 4, 1, 1e-3), 4 / (1.4826 / std::sqrt(2.0)));
  // A trend does not widen the scale: a steady descent, then a jump.
  std::vector<double> descent;
  for (int i = 0; i < 30; ++i) descent.push_back(2.0 - 0.03 * i);
  EXPECT_DOUBLE_EQ(jump_z(descent, descent.back() + 0.5, 1, 1e-3), 0.5 / 1e-3);  // no noise: the floor
  // A constant history: the floor is the scale, or an infinite z without one.
  const std::vector<double> flat(20, 2.0);
  EXPECT_DOUBLE_EQ(jump_z(flat, 2.01, 10, 1e-3), (2.01 - 2.0) / 1e-3);
  EXPECT_EQ(jump_z(flat, 2.01, 10, 0.0), INFINITY);
}

TEST(SpikeWindow, JudgesOnlyAfterItsHistoryAndKeepsOnlyFiniteValues) {
  SpikeWindow w(SpikeRule{.window = 12, .min_history = 10});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w.judge(1.0 + 0.01 * (i % 3)), 0.0) << i;  // warming up
  EXPECT_EQ(w.judge(kNaN), 0.0);               // not judged, not kept
  EXPECT_EQ(w.judge(0.0), 0.0);                // nor a value without a logarithm
  EXPECT_GT(w.judge(5.0), 6.0);                // a spike
  for (int i = 0; i < 40; ++i) w.judge(1.0);   // the ring forgets it
  EXPECT_DOUBLE_EQ(w.recent_median(), 1.0);
}

// The window's state (what checkpoints keep): the last `window` logarithms oldest first; a window
// restored from it judges the next value as the original does.
TEST(SpikeWindow, StateRoundTripsOldestFirst) {
  SpikeWindow a(SpikeRule{.window = 12});
  for (int i = 1; i <= 20; ++i) a.judge(static_cast<double>(i));
  const std::vector<double> logs = a.logs();
  ASSERT_EQ(logs.size(), 12u);
  EXPECT_DOUBLE_EQ(logs.front(), std::log(9.0));
  EXPECT_DOUBLE_EQ(logs.back(), std::log(20.0));
  SpikeWindow b(SpikeRule{.window = 12});
  b.restore(logs);
  EXPECT_EQ(b.logs(), logs);
  EXPECT_EQ(a.judge(60.0), b.judge(60.0));
  EXPECT_EQ(a.logs(), b.logs());
}

StepRecord record(int64_t step, float loss, float grad_norm) {
  StepRecord r;
  r.step = step;
  r.loss = loss;
  r.grad_norm = grad_norm;
  return r;
}

TEST(SpikeDetector, OneFindingForOneSpikeNamingSiteAndStep) {
  std::ostringstream out;
  std::vector<nlohmann::json> records;
  FindingLog log(out, [&](const nlohmann::json& j) { records.push_back(j); });
  SpikeDetector spikes(SpikeRule{}, log, FaultAction::kWarn);
  for (int64_t s = 0; s < 30; ++s) spikes.end_step(record(s, 3.0f - 0.01f * static_cast<float>(s % 5), 1.0f));
  spikes.end_step(record(30, 9.0f, 1.0f));
  for (int64_t s = 31; s < 40; ++s) spikes.end_step(record(s, 3.0f, 1.0f));
  EXPECT_EQ(log.count(), 1);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["finding"]["detector"], "spike");
  EXPECT_EQ(records[0]["finding"]["site"], "loss");
  EXPECT_EQ(records[0]["finding"]["step"], 31);
  EXPECT_EQ(records[0]["finding"]["classification"], "spike");
  EXPECT_TRUE(test::matches(out.str(), "finding: after step 31, detector spike, site loss, ranks all: robust z [0-9.e+]+ "
                                       "against bound 6 \\(spike\\); value 9, median of the last 10 steps 2.98; "
                                       "scale from the step-to-step changes of the last 50\n"));
  SpikeDetector stopping(SpikeRule{}, log, FaultAction::kStop);
  for (int64_t s = 0; s < 30; ++s) stopping.end_step(record(s, 3.0f, 1.0f + 0.01f * static_cast<float>(s % 4)));
  try {
    stopping.end_step(record(30, 3.0f, 50.0f));
    ADD_FAILURE() << "no FaultStop";
  } catch (const FaultStop& e) {
    EXPECT_EQ(e.exit_code(), kExitNumeric);
    EXPECT_TRUE(test::matches(e.what(), "stopped after step 31 on the spike finding at grad_norm \\(\\[verify\\] on_spike = \"stop\".*"));
  }
}

TEST(NonFiniteDetector, NanOrInfiniteLossOrNormIsAFinding) {
  std::ostringstream out;
  FindingLog log(out, {});
  NonFiniteDetector warn(log, FaultAction::kWarn);
  warn.end_step(record(0, 2.5f, 1.0f));
  EXPECT_EQ(log.count(), 0);
  warn.end_step(record(1, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()));
  EXPECT_EQ(log.count(), 1);  // one per step
  EXPECT_TRUE(test::matches(out.str(), "finding: after step 2, detector nonfinite, site loss, ranks all: value nan .*\n"));
  NonFiniteDetector stop(log, FaultAction::kStop);
  try {
    stop.end_step(record(4, 2.0f, std::numeric_limits<float>::infinity()));
    ADD_FAILURE() << "no FaultStop";
  } catch (const FaultStop& e) {
    EXPECT_EQ(e.exit_code(), kExitNumeric);
  }
  EXPECT_EQ(finding_json({.magnitude = kNaN})["finding"]["magnitude"], "nan");
}

TEST(FaultAction, ParsesWarnStopAndRollbackWhereAllowed) {
  EXPECT_EQ(parse_fault_action("warn", "x"), FaultAction::kWarn);
  EXPECT_EQ(parse_fault_action("stop", "x"), FaultAction::kStop);
  EXPECT_EQ(parse_fault_action("rollback", "x", true), FaultAction::kRollback);
  EXPECT_TRUE(test::matches(test::config_error([] { parse_fault_action("explode", "c.toml: [verify] on_fault", true); }),
                            "c.toml: \\[verify\\] on_fault: expected \"rollback\", \"stop\" or \"warn\", got \"explode\""));
  EXPECT_TRUE(test::matches(test::config_error([] { parse_fault_action("explode", "c.toml: [verify] on_spike"); }),
                            "c.toml: \\[verify\\] on_spike: expected \"stop\" or \"warn\", got \"explode\""));
  EXPECT_TRUE(test::matches(test::config_error([] { parse_fault_action("rollback", "w"); }),
                            "w: \"rollback\" is for faults \\(on_fault\\).*"));
}

// Rollback throws on every rank, with the finding.
TEST(FaultAction, RollbackThrowsWithTheFinding) {
  std::ostringstream out;
  FindingLog log(out, {});
  try {
    log.report({.step = 3, .ranks = {1}, .detector = "abft", .site = "gemm/x/forward"}, FaultAction::kRollback,
               kExitCorruption, "on_fault");
    ADD_FAILURE() << "no rollback";
  } catch (const FaultRollback& e) {
    EXPECT_EQ(e.finding().site, "gemm/x/forward");
    EXPECT_EQ(e.finding().ranks, std::vector<int>{1});
  }
  EXPECT_EQ(log.count(), 1);
}

// A spike detector at the default rule that warns into a log, and the noise of a simulated run.
struct WarningSpikes {
  explicit WarningSpikes(unsigned seed) : rng(seed) {}
  std::ostringstream out;
  FindingLog log{out, {}};
  SpikeDetector spikes{SpikeRule{}, log, FaultAction::kWarn};
  std::mt19937 rng;
  std::normal_distribution<double> normal{0.0, 1.0};
  double noise() { return normal(rng); }
};

// tiny.toml's clean fp32 run: a loss falling from 6.2 to the plateau at ln 16 ≈ 2.77 in 30 steps,
// then one step at 15.9 (rare tokens' embeddings, moved by Adam while unused, meeting a changed
// hidden state): a spike; the descent itself is not.
TEST(SpikeDetector, FindsAJumpRightAfterAFastDescent) {
  WarningSpikes w(3);
  for (int64_t s = 0; s < 41; ++s) {
    const double loss = 2.775 + 3.45 * std::exp(-static_cast<double>(s) / 7.0) + 0.003 * w.noise();
    w.spikes.end_step(record(s, static_cast<float>(loss), 0.3f + 0.02f * static_cast<float>(s % 3)));
  }
  EXPECT_EQ(w.log.count(), 0) << w.out.str();
  w.spikes.end_step(record(41, 15.91f, 0.33f));
  EXPECT_EQ(w.log.count(), 1);
  EXPECT_TRUE(test::matches(w.out.str(), "finding: after step 42, detector spike, site loss, .*\n")) << w.out.str();
}

// A clean run's loss decays with noise and its gradient norm wanders by factors (a slow random walk
// and step-to-step noise of 10%): 10,000 steps, no finding at the default rule.
TEST(SpikeDetector, NoFalseAlarmOnTenThousandNoisyCleanSteps) {
  WarningSpikes w(1);
  double drift = 0;
  for (int64_t s = 0; s < 10000; ++s) {
    const double loss = 2.0 + 3.0 * std::exp(-static_cast<double>(s) / 1500.0) + 0.03 * w.noise();
    drift = 0.98 * drift + 0.05 * w.noise();
    const double norm = (0.5 + 2.0 * std::exp(-static_cast<double>(s) / 500.0)) * std::exp(drift + 0.1 * w.noise());
    w.spikes.end_step(record(s, static_cast<float>(loss), static_cast<float>(norm)));
  }
  EXPECT_EQ(w.log.count(), 0) << w.out.str();
}

// A buffer changed between the update and the next step is named; one left alone is not; the first
// step (nothing hashed yet) is not judged.
TEST(StateAtRestDetector, NamesTheBufferChangedBetweenSteps) {
  std::vector<float> params(300, 0.5f), m(300, 0.01f), v(300, 1e-4f);
  comm::SelfCommunicator world;
  std::ostringstream out;
  std::vector<nlohmann::json> records;
  FindingLog log(out, [&](const nlohmann::json& j) { records.push_back(j); });
  StateAtRestDetector warn({{"parameters", params}, {"optim/m", m}, {"optim/v", v}}, world, log, FaultAction::kWarn);
  warn.begin_step(0);
  warn.after_update(0);
  params[7] = 0.25f;  // the update's own writes come before the hash; this is after it
  warn.begin_step(1);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["finding"]["site"], "parameters");
  EXPECT_EQ(records[0]["finding"]["ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(records[0]["finding"]["classification"], "corruption");
  warn.after_update(1);
  warn.begin_step(2);
  EXPECT_EQ(log.count(), 1);  // unchanged since
  StateAtRestDetector stop({{"parameters", params}, {"optim/m", m}, {"optim/v", v}}, world, log, FaultAction::kStop);
  stop.after_update(4);
  v[299] = std::bit_cast<float>(std::bit_cast<uint32_t>(v[299]) ^ 1u);  // the lowest bit
  try {
    stop.begin_step(5);
    ADD_FAILURE() << "no FaultStop";
  } catch (const FaultStop& e) {
    EXPECT_EQ(e.exit_code(), kExitCorruption);
    EXPECT_TRUE(test::matches(out.str(), "(.*\n)?finding: after step 5, detector state_at_rest, site optim/v, ranks 0: .*\n"));
  }
}

}  // namespace
}  // namespace lockstep::detect
