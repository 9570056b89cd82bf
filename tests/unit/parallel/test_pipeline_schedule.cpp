// Invariants of the pipeline schedules (src/parallel/pipeline_schedule.hpp) over pp 1-8, 1-24
// micro-batches and 2-4 chunks: every (stage, micro-batch) has one forward and one backward (or
// one Bi and one W after it) on the rank that holds the stage; each rank's backward of a
// micro-batch comes after its forward; what a stage sends to a neighbour arrives in the order the
// neighbour takes it (so in-order messages match); the table completes when simulated (no pass
// waits for one that never comes); the bubble is the literature's, (p − 1)/(m + p − 1) and
// (p − 1)/(v·m + p − 1), and the zero-bubble schedule's (p − 1)/(3m + p − 1) (m ≥ p; below, no
// more than 1F1B's), exactly on unit costs, with no more micro-batches in flight than 1F1B; the
// peaks are those the header states.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "src/core/check.hpp"
#include "src/parallel/pipeline_schedule.hpp"

namespace lockstep::parallel {
namespace {

const ScheduleKind kAll[] = {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                             ScheduleKind::kZeroBubble};

// The shapes each kind takes: (pp, micro-batches, chunks).
std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes(ScheduleKind k) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (int64_t p : {1, 2, 3, 4, 8}) {
    for (int64_t m = 1; m <= 24; ++m) {
      if (k != ScheduleKind::kInterleaved) {
        out.emplace_back(p, m, 1);
      } else if (m % p == 0) {
        for (int64_t v : {2, 3, 4}) out.emplace_back(p, m, v);
      }
    }
  }
  return out;
}

bool splits_backward(ScheduleKind k) { return k == ScheduleKind::kZeroBubble; }

TEST(PipelineSchedule, EveryPassOnceInDependencyOrder) {
  for (ScheduleKind k : kAll) {
    for (auto [p, m, v] : shapes(k)) {
      SCOPED_TRACE(testing::Message() << schedule_name(k) << " pp " << p << " m " << m << " v " << v);
      const PipelineSchedule s = make_schedule(k, p, m, v, "test");
      ASSERT_EQ(static_cast<int64_t>(s.ranks.size()), p);
      std::map<std::tuple<int64_t, int64_t, PassKind>, int> count;  // (stage, micro, kind)
      for (int64_t r = 0; r < p; ++r) {
        std::set<std::pair<int, int64_t>> forwarded, input_done;
        for (const Pass& pass : s.ranks[static_cast<size_t>(r)]) {
          ASSERT_GE(pass.chunk, 0);
          ASSERT_LT(pass.chunk, v);
          ASSERT_GE(pass.micro, 0);
          ASSERT_LT(pass.micro, m);
          const auto key = std::pair{pass.chunk, pass.micro};
          ++count[{s.stage(r, pass.chunk), pass.micro, pass.kind}];
          switch (pass.kind) {
            case PassKind::kForward: forwarded.insert(key); break;
            case PassKind::kBackward:
            case PassKind::kBackwardInput:
              EXPECT_TRUE(forwarded.count(key)) << "backward before forward, micro " << pass.micro;
              input_done.insert(key);
              break;
            case PassKind::kBackwardWeight:
              EXPECT_TRUE(input_done.count(key)) << "W before Bi, micro " << pass.micro;
              break;
          }
        }
      }
      const std::vector<PassKind> kinds =
          splits_backward(k) ? std::vector{PassKind::kForward, PassKind::kBackwardInput, PassKind::kBackwardWeight}
                             : std::vector{PassKind::kForward, PassKind::kBackward};
      EXPECT_EQ(count.size(), kinds.size() * static_cast<size_t>(p * v * m));
      for (int64_t stage = 0; stage < p * v; ++stage) {
        for (int64_t i = 0; i < m; ++i) {
          for (PassKind kind : kinds) EXPECT_EQ((count[{stage, i, kind}]), 1) << "stage " << stage << " micro " << i;
        }
      }
    }
  }
}

TEST(PipelineSchedule, MessagesArriveInTheOrderTheyAreTaken) {
  for (ScheduleKind k : kAll) {
    for (auto [p, m, v] : shapes(k)) {
      SCOPED_TRACE(testing::Message() << schedule_name(k) << " pp " << p << " m " << m << " v " << v);
      const PipelineSchedule s = make_schedule(k, p, m, v, "test");
      // Per channel (from rank, to rank, activation or gradient): the micro-batches and chunks in
      // the order sent, and in the order received.
      std::map<std::tuple<int64_t, int64_t, bool>, std::vector<std::pair<int64_t, int64_t>>> sent, received;
      for (int64_t r = 0; r < p; ++r) {
        for (const Pass& pass : s.ranks[static_cast<size_t>(r)]) {
          const int64_t stage = s.stage(r, pass.chunk);
          if (pass.kind == PassKind::kForward) {
            if (stage + 1 < s.stages()) sent[{r, s.rank_of(stage + 1), true}].push_back({stage + 1, pass.micro});
            if (stage > 0) received[{s.rank_of(stage - 1), r, true}].push_back({stage, pass.micro});
          } else if (pass.kind != PassKind::kBackwardWeight) {
            if (stage > 0) sent[{r, s.rank_of(stage - 1), false}].push_back({stage - 1, pass.micro});
            if (stage + 1 < s.stages()) received[{s.rank_of(stage + 1), r, false}].push_back({stage, pass.micro});
          }
        }
      }
      EXPECT_EQ(sent, received);
    }
  }
}

TEST(PipelineSchedule, BubblesAndPeaksAreThoseStated) {
  const PassCosts unit;
  for (ScheduleKind k : kAll) {
    for (auto [p, m, v] : shapes(k)) {
      SCOPED_TRACE(testing::Message() << schedule_name(k) << " pp " << p << " m " << m << " v " << v);
      const Timeline t = simulate(make_schedule(k, p, m, v, "test"), unit);
      if (bubble_formula(k, p, m, v) >= 0) {
        EXPECT_NEAR(t.bubble, bubble_formula(k, p, m, v), 1e-12);
      } else {  // zb with fewer micro-batches than stages: no worse than 1F1B
        EXPECT_LE(t.bubble, simulate(make_schedule(ScheduleKind::kOneFOneB, p, m, 1, "test"), unit).bubble + 1e-12);
      }
      for (int64_t r = 0; r < p; ++r) {
        const int64_t peak = t.peak_in_flight[static_cast<size_t>(r)];
        switch (k) {
          case ScheduleKind::kGpipe: EXPECT_EQ(peak, m); break;
          case ScheduleKind::kOneFOneB:
          case ScheduleKind::kZeroBubble: EXPECT_EQ(peak, std::min(p - r, m)) << "rank " << r; break;
          case ScheduleKind::kInterleaved:
            EXPECT_EQ(peak, std::min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1)) << "rank " << r;
            break;
        }
        // Each chunk's own peak: with one chunk the rank's (zb: up to its W, at most 2p − r − 1);
        // with several at least their share of it and at most all of it each, and never more than
        // the chunk's micro-batches.
        const std::vector<int64_t> chunks = chunk_peaks(make_schedule(k, p, m, v, "test").ranks[static_cast<size_t>(r)], v);
        ASSERT_EQ(static_cast<int64_t>(chunks.size()), v);
        const int64_t held = k == ScheduleKind::kZeroBubble ? std::min(2 * p - r - 1, m) : std::min(peak, m);
        int64_t sum = 0;
        for (int64_t c : chunks) {
          EXPECT_LE(c, held);
          sum += c;
        }
        if (v == 1 && k != ScheduleKind::kZeroBubble) {
          EXPECT_EQ(sum, peak);
        }
        EXPECT_GE(sum, peak);
        EXPECT_EQ(t.chunk_slots[static_cast<size_t>(r)], sum);
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleKeepsTheWaitingWeightGradientsBounded) {
  for (auto [p, m, v] : shapes(ScheduleKind::kZeroBubble)) {
    const PipelineSchedule s = make_schedule(ScheduleKind::kZeroBubble, p, m, v, "test");
    for (int64_t r = 0; r < p; ++r) {
      int64_t not_weighted = 0, peak = 0;
      for (const Pass& pass : s.ranks[static_cast<size_t>(r)]) {
        if (pass.kind == PassKind::kForward) peak = std::max(peak, ++not_weighted);
        if (pass.kind == PassKind::kBackwardWeight) --not_weighted;
      }
      EXPECT_LE(peak, 2 * p - r - 1) << "pp " << p << " m " << m << " rank " << r;
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleSplitsTheBackwardAndFillsTheCooldown) {
  // pp 4, 8 micro-batches: 1F1B idles (p − 1)/(m + p − 1) = 3/11 of the step; ZB-H1 far less.
  const Timeline zb = simulate(make_schedule(ScheduleKind::kZeroBubble, 4, 8, 1, "test"), PassCosts{});
  EXPECT_LT(zb.bubble, 3.0 / 11 / 2);
  // A p2p latency delays, never deadlocks, and adds to the bubble.
  const Timeline slow = simulate(make_schedule(ScheduleKind::kOneFOneB, 4, 8, 1, "test"), {1, 1, 1, 0.5});
  EXPECT_GT(slow.bubble, 3.0 / 11);
}

TEST(PipelineSchedule, ATiedEmbeddingWaitsForTheHeadsLastWeightGradient) {
  // The first rank's last input-gradient pass starts after the last rank's last weight-gradient
  // pass plus the send of the head's gradient, as the trainer orders them (pipeline.cpp).
  const TiedEmbedding tied{true, 0.25};
  for (ScheduleKind k : kAll) {
    for (auto [p, m, v] : shapes(k)) {
      if (p == 1) continue;
      SCOPED_TRACE(testing::Message() << schedule_name(k) << " pp " << p << " m " << m << " v " << v);
      const PipelineSchedule s = make_schedule(k, p, m, v, "test");
      const std::vector<PassCosts> costs(static_cast<size_t>(p), PassCosts{});
      const Timeline free = simulate(s, costs), t = simulate(s, costs, tied);
      const auto placed = [&](const Timeline& tl, int64_t rank, size_t index) {
        size_t seen = 0;
        for (const TimedPass& x : tl.passes) {
          if (x.rank == rank && seen++ == index) return x;
        }
        ADD_FAILURE() << "no pass " << index << " of rank " << rank;
        return TimedPass{};
      };
      const size_t head_done = final_passes(s.ranks.back(), v).last_weight();
      const size_t embedding_waits = final_passes(s.ranks.front(), v).last_input();
      EXPECT_GE(placed(t, 0, embedding_waits).start, placed(t, p - 1, head_done).end + tied.send);
      // Where the free table already orders them, the send is all the wait adds: at most once to the step.
      if (placed(free, 0, embedding_waits).start >= placed(free, p - 1, head_done).end) {
        EXPECT_LE(t.makespan, free.makespan + tied.send + 1e-12);
      }
      if (k != ScheduleKind::kZeroBubble) {
        EXPECT_LE(t.makespan, free.makespan + tied.send + 1e-12);
      }
    }
  }
  // ZB with one micro-batch: the overlap of the last rank's W with the first rank's Bi is lost.
  const PipelineSchedule one = make_schedule(ScheduleKind::kZeroBubble, 2, 1, 1, "test");
  const std::vector<PassCosts> unit(2, PassCosts{});
  EXPECT_DOUBLE_EQ(simulate(one, unit).makespan, 5);  // F F Bi Bi W
  EXPECT_DOUBLE_EQ(simulate(one, unit, {true, 0}).makespan, 6);  // F F Bi W Bi W
}

TEST(PipelineSchedule, ATableThatWouldHangIsFound) {
  PipelineSchedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2, 1, "test");
  std::swap(s.ranks[1][0], s.ranks[1][1]);  // rank 1's first backward before its forward
  EXPECT_THROW(simulate(s, PassCosts{}), InternalError);
}

TEST(PipelineSchedule, ShapesThatDoNotFitAreOneErrorEach) {
  const auto message = [](ScheduleKind k, int64_t p, int64_t m, int64_t v) {
    try {
      make_schedule(k, p, m, v, "c.toml: [parallel]");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(ScheduleKind::kInterleaved, 4, 6, 2).find("multiple of pp (4)"), std::string::npos);
  EXPECT_NE(message(ScheduleKind::kInterleaved, 4, 8, 1).find("virtual_stages >= 2"), std::string::npos);
  EXPECT_NE(message(ScheduleKind::kOneFOneB, 4, 8, 2).find("needs schedule = \"interleaved\""), std::string::npos);
  EXPECT_NE(message(ScheduleKind::kGpipe, 0, 8, 1).find("pp (0) must be >= 1"), std::string::npos);
  EXPECT_NE(message(ScheduleKind::kZeroBubble, 2, 0, 1).find("must be >= 1"), std::string::npos);
  EXPECT_THROW(parse_schedule_kind("1F1B", "where"), ConfigError);
  EXPECT_EQ(parse_schedule_kind("zb", "where"), ScheduleKind::kZeroBubble);
}

}  // namespace
}  // namespace lockstep::parallel
