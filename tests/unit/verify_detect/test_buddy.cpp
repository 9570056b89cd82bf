// Buddy replay's verdict (verify/detect/buddy.hpp) on simulated computations: every rank computes
// the witness of a batch, a fault changes it from some tensor on (and the rest of the rank's tp
// group from a later one, as a collective would carry it); the verdict must name the faulty rank
// where three groups can tell, the pair where two cannot, and tell a fault that hit once from one
// that every run meets. Also the witness itself: the hashes of what the hook shows, in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "verify/detect/buddy.hpp"

namespace lockstep::detect {
namespace {

enum Run { kA, kB, kC };

struct Fault {
  int64_t group = 0, tp = 0;  // the faulty rank's coordinates
  std::vector<Run> runs;      // the runs it meets
  size_t at = 0;              // the first tensor it changes on that rank
};

constexpr size_t kTensors = 24;
constexpr size_t kSpread = 3;  // tensors until a collective carries it to the rest of the tp group

// The witnesses of run `run` on a dp × tp mesh (world rank = group · tp + t).
std::vector<std::vector<uint64_t>> simulate(int64_t dp, int64_t tp, Run run, const std::vector<Fault>& faults) {
  std::vector<std::vector<uint64_t>> w;
  for (int64_t g = 0; g < dp; ++g) {
    const int64_t batch = run == kB ? (g + dp - 1) % dp : g;
    for (int64_t t = 0; t < tp; ++t) {
      std::vector<uint64_t> h(kTensors);
      for (size_t i = 0; i < kTensors; ++i) h[i] = static_cast<uint64_t>(batch * 1000 + t * 100) + i;
      for (const Fault& f : faults) {
        if (f.group != g || std::find(f.runs.begin(), f.runs.end(), run) == f.runs.end()) continue;
        const size_t from = f.tp == t ? f.at : f.at + kSpread;
        for (size_t i = from; i < kTensors; ++i) h[i] ^= 0x9e3779b97f4a7c15ULL + 17 * f.at;
      }
      w.push_back(h);
    }
  }
  return w;
}

BuddyRuns runs_of(int64_t dp, int64_t tp, const std::vector<Fault>& faults) {
  BuddyRuns r{.dp = dp, .tp = tp, .original = simulate(dp, tp, kA, faults), .buddy = simulate(dp, tp, kB, faults),
              .third = {}};
  if (!disagreeing_batches(r).empty()) r.third = simulate(dp, tp, kC, faults);
  return r;
}

using Kind = BuddyVerdict::Kind;

TEST(BuddyVerdict, CleanRunsAgreeWithoutAThirdRun) {
  const BuddyRuns r = runs_of(3, 2, {});
  EXPECT_TRUE(disagreeing_batches(r).empty());
  EXPECT_TRUE(r.third.empty());
  EXPECT_EQ(judge_buddies(r).kind, Kind::kAgree);
}

TEST(BuddyVerdict, AFaultInTheStepsOwnRunIsTransientOnItsRank) {
  const BuddyVerdict v = judge_buddies(runs_of(3, 2, {{.group = 1, .tp = 0, .runs = {kA}, .at = 5}}));
  EXPECT_EQ(v.kind, Kind::kOriginalHit);
  EXPECT_EQ(v.ranks, std::vector<int>({2}));
  EXPECT_EQ(v.tensor, 5u);
}

TEST(BuddyVerdict, AFaultInTheBuddysRunIsTransientOnTheBuddy) {
  const BuddyRuns r = runs_of(3, 2, {{.group = 2, .tp = 1, .runs = {kB}, .at = 9}});
  EXPECT_EQ(disagreeing_batches(r), std::vector<int64_t>({1}));  // group 2 computes batch 1 as a buddy
  const BuddyVerdict v = judge_buddies(r);
  EXPECT_EQ(v.kind, Kind::kBuddyHit);
  EXPECT_EQ(v.ranks, std::vector<int>({5}));
}

TEST(BuddyVerdict, APersistentFaultIsPinnedToItsRankWithThreeGroupsOrMore) {
  for (int64_t dp : {3, 4, 5}) {
    for (int64_t group = 0; group < dp; ++group) {
      const BuddyRuns r = runs_of(dp, 2, {{.group = group, .tp = 1, .runs = {kA, kB, kC}, .at = 4}});
      EXPECT_EQ(disagreeing_batches(r).size(), 2u);  // its own batch and the one it computes as a buddy
      const BuddyVerdict v = judge_buddies(r);
      EXPECT_EQ(v.kind, Kind::kPersistent) << "dp " << dp << " group " << group;
      EXPECT_TRUE(v.pinned);
      EXPECT_EQ(v.ranks, std::vector<int>({static_cast<int>(group * 2 + 1)})) << "dp " << dp << " group " << group;
      EXPECT_EQ(v.tensor, 4u);
    }
  }
}

TEST(BuddyVerdict, WithTwoGroupsAPersistentFaultIsNamedWithItsPair) {
  const BuddyVerdict v = judge_buddies(runs_of(2, 2, {{.group = 0, .tp = 1, .runs = {kA, kB, kC}, .at = 7}}));
  EXPECT_EQ(v.kind, Kind::kPersistent);
  EXPECT_FALSE(v.pinned);
  EXPECT_EQ(v.ranks, std::vector<int>({1, 3}));  // tp rank 1 of either group: the first to differ in both
}

TEST(BuddyVerdict, AStepThatDoesNotReproduceOnAGroupIsPersistentThere) {
  const BuddyVerdict v = judge_buddies(runs_of(2, 1, {{.group = 1, .tp = 0, .runs = {kA}, .at = 3},
                                                      {.group = 1, .tp = 0, .runs = {kC}, .at = 11}}));
  EXPECT_EQ(v.kind, Kind::kPersistent);
  EXPECT_TRUE(v.pinned);
  EXPECT_EQ(v.ranks, std::vector<int>({1}));
  EXPECT_EQ(v.tensor, 3u);
}

TEST(BuddyVerdict, RanksThatDifferAtOnceAreAllNamed) {
  // Two ranks of one group hit at the same tensor (a fault before a replicated op).
  const BuddyVerdict v = judge_buddies(runs_of(3, 2, {{.group = 0, .tp = 0, .runs = {kA}, .at = 2},
                                                      {.group = 0, .tp = 1, .runs = {kA}, .at = 2}}));
  EXPECT_EQ(v.kind, Kind::kOriginalHit);
  EXPECT_EQ(v.ranks, std::vector<int>({0, 1}));
}

TEST(TensorWitness, HashesWhatItSeesWhileCollectingInOrder) {
  TensorWitness w;
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  const auto view = [](std::vector<float>& x) {
    return TensorView::contiguous(x.data(), DType::kF32, Shape({static_cast<int64_t>(x.size())}));
  };
  w.observe("before", view(a));  // not collecting: ignored
  w.start();
  w.observe("a", view(a));
  w.observe("b", view(b));
  const std::vector<uint64_t> first = w.stop();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(w.name(1), "b");
  EXPECT_NE(first[0], first[1]);
  w.start();
  a[1] = std::nextafter(a[1], 3.0f);  // one ulp
  w.observe("a", view(a));
  w.observe("b", view(b));
  const std::vector<uint64_t> second = w.stop();
  EXPECT_NE(second[0], first[0]);
  EXPECT_EQ(second[1], first[1]);
}

}  // namespace
}  // namespace lockstep::detect
