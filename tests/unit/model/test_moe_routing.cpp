// The rows of the experts' buffer (src/model/moe_routing.hpp): the capacity's formula, a routing
// worked by hand with drops in each group, and dropless routings where every choice has a row,
// expert-major, in token order; and ranks that each hold some of the tokens (context parallelism)
// drop what the whole routing drops and give their tokens the whole routing's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "src/model/moe_routing.hpp"

namespace lockstep {
namespace {

TEST(MoeRouting, CapacityRoundsUpAndZeroIsDropless) {
  EXPECT_EQ(moe_capacity(1.0, 128, 2, 4), 64);
  EXPECT_EQ(moe_capacity(1.25, 10, 1, 4), 4);  // ceil(3.125)
  EXPECT_EQ(moe_capacity(0.01, 10, 1, 4), 1);
  EXPECT_EQ(moe_capacity(0.0, 128, 2, 4), 0);
}

TEST(MoeRouting, CapacityDropsLaterTokensOfEachGroup) {
  // 4 tokens in groups of 2, 2 choices each among 3 experts, one token of each expert per group.
  const std::vector<int32_t> experts = {0, 1, 0, 2, 1, 0, 2, 1};
  MoeRouting r;
  r.size_for(4, 2, 3, 4);
  r.assign(experts.data(), 4, 2, 2, 1);
  EXPECT_EQ(r.R, 6);
  EXPECT_EQ(r.routed, (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(r.expert_first, (std::vector<int64_t>{0, 2, 4, 6}));
  // Token 1's choice of expert 0 and token 3's of expert 1 come second in their group: dropped.
  EXPECT_EQ(std::vector<int32_t>(r.rows.begin(), r.rows.begin() + 8), (std::vector<int32_t>{0, 2, -1, 4, 3, 1, 5, -1}));
  EXPECT_EQ(std::vector<int32_t>(r.token_of_row.begin(), r.token_of_row.begin() + 6),
            (std::vector<int32_t>{0, 2, 0, 2, 1, 3}));
}

TEST(MoeRouting, DroplessRowsAreExpertMajorInTokenOrder) {
  std::mt19937 rng(3);
  for (int64_t E : {1, 3, 8}) {
    for (int64_t K = 1; K <= std::min<int64_t>(E, 3); ++K) {
      const int64_t N = 37;
      std::vector<int32_t> experts;
      for (int64_t n = 0; n < N; ++n) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        for (int32_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);  // K distinct experts a token
        experts.insert(experts.end(), all.begin(), all.begin() + K);
      }
      MoeRouting r;
      r.size_for(N, K, E, N);
      r.assign(experts.data(), N, K, N, 0);
      ASSERT_EQ(r.R, N * K);
      for (int64_t i = 0; i < N * K; ++i) {
        const int32_t row = r.rows[static_cast<size_t>(i)];
        const int32_t e = experts[static_cast<size_t>(i)];
        ASSERT_GE(row, r.expert_first[e]);
        ASSERT_LT(row, r.expert_first[e + 1]);
        ASSERT_EQ(r.token_of_row[row], i / K);
      }
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_EQ(r.kept(e), r.routed[e]);
        for (int64_t row = r.expert_first[e] + 1; row < r.expert_first[e + 1]; ++row) {
          EXPECT_LT(r.token_of_row[row - 1], r.token_of_row[row]) << "expert " << e << " row " << row;
        }
      }
    }
  }
}

TEST(MoeRouting, RanksHoldingSomeTokensKeepTheWholeRoutingsChoices) {
  // 8 tokens in groups of 4 (two sequences), 2 choices each among 3 experts, capacity 2; rank 0
  // holds tokens 0, 1, 6, 7 and rank 1 tokens 2..5 (zig-zag blocks), in that order.
  std::mt19937 rng(5);
  const int64_t N = 8, K = 2, E = 3;
  std::vector<int32_t> experts;
  for (int64_t n = 0; n < N; ++n) {
    const auto first = static_cast<int32_t>(rng() % 3);
    experts.insert(experts.end(), {first, static_cast<int32_t>((first + 1 + rng() % 2) % 3)});
  }
  MoeRouting whole;
  whole.size_for(N, K, E, N);
  whole.assign(experts.data(), N, K, 4, 2);
  const std::vector<std::vector<int64_t>> held = {{0, 1, 6, 7}, {2, 3, 4, 5}};
  int64_t rows = 0;
  std::vector<int64_t> routed(E, 0);
  for (const auto& tokens : held) {
    std::vector<int32_t> local(N, -1);
    for (size_t i = 0; i < tokens.size(); ++i) local[static_cast<size_t>(tokens[i])] = static_cast<int32_t>(i);
    MoeRouting r;
    r.size_for(4, K, E, N);
    r.assign(experts.data(), N, K, 4, 2, local.data());
    rows += r.R;
    for (int64_t e = 0; e < E; ++e) routed[e] += r.routed[e];
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int64_t j = 0; j < K; ++j) {
        const int32_t row = r.rows[i * K + j];
        const auto at = static_cast<size_t>(tokens[i] * K + j);
        ASSERT_EQ(row < 0, whole.rows[at] < 0) << "token " << tokens[i] << " choice " << j;
        if (row < 0) continue;
        const int32_t e = experts[at];
        ASSERT_GE(row, r.expert_first[e]);
        ASSERT_LT(row, r.expert_first[e + 1]);
        ASSERT_EQ(r.token_of_row[row], static_cast<int32_t>(i));
      }
    }
  }
  EXPECT_LT(whole.R, N * K);  // 8 choices a group, 6 kept at most
  EXPECT_EQ(rows, whole.R);
  EXPECT_EQ(routed, whole.routed);
}

}  // namespace
}  // namespace lockstep
