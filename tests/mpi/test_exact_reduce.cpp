// Exact collectives under 2, 3 and 4 ranks: the exact reduce-scatter, the exact scalar combination
// and the fp32-source reduce-scatter give bitwise the same result as one process summing every
// rank's partials exactly, for every group size up to the world's, in rank order and reversed.
// Inputs are fp32 values with exponents spread over [-140, 120] in one element's partials, so
// double sums are often inexact (ExactAccumulator spills), and exact_reduce_scatter sends those
// elements' SuperAccumulators next to the doubles.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "src/core/check.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::parallel {
namespace {

using test::g_world;

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr int kPartials = 5;  // per element per rank

// Partial k of element e from world rank r: a random fp32 value. Every 7th element spreads its
// exponents over [-140, 120] (spills); the rest stay within [-20, 20] (the double path).
float partial(int r, int64_t e, int k) {
  const uint64_t h = splitmix(splitmix(splitmix(static_cast<uint64_t>(r)) ^ static_cast<uint64_t>(e)) ^
                              static_cast<uint64_t>(k));
  const bool wide = e % 7 == 0;
  const int exp = wide ? static_cast<int>(h % 261) - 140 : static_cast<int>(h % 41) - 20;
  const float mant = static_cast<float>((h >> 20) & 0xffffff) / 16777216.0f + 0.5f;  // [0.5, 1.5)
  const float v = std::ldexp(mant, exp);
  return (h >> 60) & 1 ? -v : v;
}

// A flat buffer of odd-sized tensors (offsets not multiples of 64).
std::vector<ParamTensor> test_layout() {
  std::vector<ParamTensor> layout;
  int64_t offset = 0;
  for (int64_t n : {1000, 37, 4100, 3, 777, 130}) {
    ParamTensor t;
    t.name = str_cat("t", layout.size());
    t.shape = {n};
    t.offset = offset;
    t.numel = n;
    layout.push_back(std::move(t));
    offset += n;
  }
  return layout;
}

int64_t total(const std::vector<ParamTensor>& layout) { return layout.back().offset + layout.back().numel; }

// One process's answer for a group of world ranks 0..g-1.
std::vector<float> single_process_sum(int g, int64_t n, size_t* spills) {
  ExactAccumulator ref(static_cast<size_t>(n));
  for (int r = 0; r < g; ++r) {
    for (int64_t e = 0; e < n; ++e) {
      for (int k = 0; k < kPartials; ++k) ref.add(static_cast<size_t>(e), partial(r, e, k));
    }
  }
  *spills = ref.spill_count();
  std::vector<float> out(static_cast<size_t>(n));
  ref.round_to(out.data());
  return out;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int shown = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      ++bad;
      if (shown++ < 5) {
        ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " (0x" << std::hex
                      << std::bit_cast<uint32_t>(got[i]) << ") want " << want[i] << " (0x"
                      << std::bit_cast<uint32_t>(want[i]) << std::dec << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// Runs `body(group)` on world ranks 0..g-1 for every g in [2, world], in rank order and reversed.
template <class Body>
void for_each_group(Body body) {
  comm::Communicator& world = *g_world;
  for (int g = 2; g <= world.size(); ++g) {
    for (bool reversed : {false, true}) {
      const int me = world.rank();
      auto group = world.split(me < g ? 0 : 1, reversed ? world.size() - 1 - me : me, "test");
      if (me < g) body(g, reversed, *group);
    }
  }
}

TEST(ExactReduce, ShardPlanCutsOnChunkStartsOfTheirTensor) {
  const auto layout = test_layout();
  for (int parts = 1; parts <= 5; ++parts) {
    const ShardPlan plan = make_shard_plan(layout, parts);
    ASSERT_EQ(plan.parts(), parts);
    EXPECT_EQ(plan.first(0), 0);
    EXPECT_EQ(plan.end(parts - 1), total(layout));
    for (int r = 0; r < parts; ++r) {
      EXPECT_LE(plan.first(r), plan.end(r));
      const int64_t cut = plan.first(r);
      bool ok = cut == total(layout);
      for (const auto& p : layout) ok |= cut >= p.offset && cut < p.offset + p.numel && (cut - p.offset) % 64 == 0;
      EXPECT_TRUE(ok) << "cut " << cut << " of " << parts << " parts is inside a 64-element chunk";
    }
  }
}

TEST(ExactReduce, ReduceScatterEqualsSingleProcessExactSumBitwise) {
  const auto layout = test_layout();
  const int64_t n = total(layout);
  for_each_group([&](int g, bool reversed, comm::Communicator& group) {
    size_t spills = 0;
    const std::vector<float> want = single_process_sum(g, n, &spills);
    ASSERT_GT(spills, 0u) << "inputs must exercise the SuperAccumulator path";
    ExactAccumulator local(static_cast<size_t>(n));
    const int world_rank = g_world->rank();
    for (int64_t e = 0; e < n; ++e) {
      for (int k = 0; k < kPartials; ++k) local.add(static_cast<size_t>(e), partial(world_rank, e, k));
    }
    ASSERT_GT(local.spill_count(), 0u) << "every rank must send SuperAccumulator records";
    const ShardPlan plan = make_shard_plan(layout, g);
    std::vector<float> shard(static_cast<size_t>(plan.size(group.rank())));
    exact_reduce_scatter(local, plan, group, shard.data());
    std::vector<float> full(static_cast<size_t>(n));
    group.all_gatherv(shard.data(), full.data(), plan.sizes(), plan.firsts(), DType::kF32);
    expect_bitwise(full, want, str_cat("exact reduce-scatter, ", g, " ranks", reversed ? " reversed" : ""));
  });
}

TEST(ExactReduce, FloatReduceScatterEqualsExactSumOfRankValues) {
  const auto layout = test_layout();
  const int64_t n = total(layout);
  for_each_group([&](int g, bool reversed, comm::Communicator& group) {
    ExactAccumulator ref(static_cast<size_t>(n));
    for (int r = 0; r < g; ++r) {
      for (int64_t e = 0; e < n; ++e) ref.add(static_cast<size_t>(e), partial(r, e, 0));
    }
    std::vector<float> want(static_cast<size_t>(n));
    ref.round_to(want.data());
    std::vector<float> local(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) local[static_cast<size_t>(e)] = partial(g_world->rank(), e, 0);
    const ShardPlan plan = make_shard_plan(layout, g);
    std::vector<float> shard(static_cast<size_t>(plan.size(group.rank()))), full(static_cast<size_t>(n));
    exact_reduce_scatter(local.data(), plan, group, shard.data());
    group.all_gatherv(shard.data(), full.data(), plan.sizes(), plan.firsts(), DType::kF32);
    expect_bitwise(full, want, str_cat("fp32 exact reduce-scatter, ", g, " ranks", reversed ? " reversed" : ""));
  });
}

TEST(ExactReduce, CombineExactEqualsOneCombinerOverAllPartials) {
  for_each_group([&](int g, bool reversed, comm::Communicator& group) {
    // Several sets: narrow (double path), wide (spilled), and cancelling to exactly zero.
    for (int set = 0; set < 3; ++set) {
      ChunkCombiner all, mine;
      for (int r = 0; r < g; ++r) {
        for (int k = 0; k < 50; ++k) {
          const int64_t e = set == 1 ? 7 * k : 7 * k + 1;
          float x = partial(r, e, k);
          if (set == 2) x = (r % 2 ? -1.0f : 1.0f) * partial(r / 2 * 2, e, k);
          if (set == 2 && g % 2 == 1 && r == g - 1) x = 0.0f;  // an odd rank out adds nothing
          all.add(x);
          if (r == g_world->rank()) mine.add(x);
        }
      }
      const float got = combine_exact(mine, group);
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(all.finish()))
          << "set " << set << ", " << g << " ranks" << (reversed ? " reversed" : "") << ": got " << got << " want "
          << all.finish();
    }
  });
}

}  // namespace
}  // namespace lockstep::parallel
