// The rows of the experts' buffer (src/model/moe_routing.hpp): the capacity's formula, a routing
// worked by hand with drops in each group, and dropless routings where every choice has a row,
// expert-major, in token order.
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
  r.size_for(4, 2, 3);
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
      r.size_for(N, K, E);
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

}  // namespace
}  // namespace lockstep
