// Expert parallelism's exchange (src/parallel/expert_parallel.hpp, src/model/moe_routing.hpp's
// ExpertRows) over the whole world as the ep group (2, 3 and 4 ranks), 1 and 3 experts per rank,
// dropless and with a capacity that drops:
//  - every rank receives exactly the rows routed to its experts from every rank, each with its
//    global token index, expert by expert in global token order;
//  - sending the rows back after a function of each row returns that function of this rank's own
//    rows, in their order (dispatch then combine is the identity).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/model/moe_routing.hpp"
#include "src/parallel/expert_parallel.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::parallel {
namespace {

using test::g_world;

constexpr int64_t kTopK = 2, kWidth = 3;

struct Case {
  int64_t held;      // experts per rank
  int64_t capacity;  // 0: dropless
};

class ExpertExchangeTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertExchangeTest, RowsReachTheirExpertsAndComeBack) {
  const Case c = GetParam();
  comm::Communicator& world = *g_world;
  const int64_t p = world.size(), me = world.rank(), E = p * c.held;
  // Rank r routes 7 + 3r tokens, each to kTopK distinct experts drawn from a seed of its own.
  const std::vector<int64_t> tokens = world.all_gather(static_cast<int64_t>(7 + 3 * me));
  int64_t offset = 0;
  for (int64_t q = 0; q < me; ++q) offset += tokens[q];
  const int64_t N = tokens[me];
  std::mt19937 rng(static_cast<unsigned>(101 + me));
  std::vector<int32_t> choice(static_cast<size_t>(N * kTopK));
  for (int64_t n = 0; n < N; ++n) {
    choice[n * kTopK] = static_cast<int32_t>(rng() % E);
    choice[n * kTopK + 1] = static_cast<int32_t>((choice[n * kTopK] + 1 + rng() % (E - 1)) % E);
  }
  MoeRouting r;
  r.size_for(N, kTopK, E, N);
  r.assign(choice.data(), N, kTopK, N, c.capacity);
  // Row i holds (its global token, its expert, i).
  std::vector<float> rows(static_cast<size_t>(r.R * kWidth));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = r.expert_first[e]; i < r.expert_first[e + 1]; ++i) {
      rows[i * kWidth] = static_cast<float>(offset + r.token_of_row[i]);
      rows[i * kWidth + 1] = static_cast<float>(e);
      rows[i * kWidth + 2] = static_cast<float>(i);
    }
  }
  CommExpertExchange exchange(world);
  ExpertRows ex;
  ex.peers = p;
  ex.experts = c.held;
  ex.plan_sends(r);
  std::vector<int64_t> row_token(static_cast<size_t>(r.R));  // the global token of each row
  for (int64_t i = 0; i < r.R; ++i) row_token[i] = offset + r.token_of_row[i];
  exchange.all_to_all(ex.send_counts.data(), ex.recv_counts.data(), c.held);
  ex.plan_receives();
  ex.received_tokens.resize(static_cast<size_t>(ex.rows));
  exchange.all_to_all_rows(row_token.data(), ex.send_rows.data(), ex.received_tokens.data(), ex.recv_rows.data(),
                           1);
  ex.order_tokens();
  std::vector<float> received(static_cast<size_t>(ex.rows * kWidth)), mine(received.size());
  exchange.all_to_all_rows(rows.data(), ex.send_rows.data(), received.data(), ex.recv_rows.data(), kWidth);
  ex.to_expert_major(received.data(), mine.data(), kWidth);

  // Every rank's kept rows per expert: what each expert must receive.
  std::vector<int64_t> kept(static_cast<size_t>(E)), all_kept(static_cast<size_t>(E * p));
  for (int64_t e = 0; e < E; ++e) kept[e] = r.kept(e);
  world.all_gather(kept.data(), all_kept.data(), E, DType::kI64);
  for (int64_t k = 0; k < c.held; ++k) {
    const int64_t e = me * c.held + k;
    int64_t want = 0;
    for (int64_t q = 0; q < p; ++q) want += all_kept[q * E + e];
    ASSERT_EQ(ex.expert_first[k + 1] - ex.expert_first[k], want) << "expert " << e;
    for (int64_t i = ex.expert_first[k]; i < ex.expert_first[k + 1]; ++i) {
      EXPECT_EQ(mine[i * kWidth + 1], static_cast<float>(e)) << "row " << i;
      EXPECT_EQ(mine[i * kWidth], static_cast<float>(ex.token[i])) << "row " << i;
      if (i > ex.expert_first[k]) {
        EXPECT_LT(ex.token[i - 1], ex.token[i]) << "expert " << e << " row " << i;
      }
    }
  }

  // Back, through y = 2x + 1.
  for (float& v : mine) v = 2 * v + 1;
  std::vector<float> staging(received.size()), back(rows.size());
  ex.to_received_order(mine.data(), staging.data(), kWidth);
  exchange.all_to_all_rows(staging.data(), ex.recv_rows.data(), back.data(), ex.send_rows.data(), kWidth);
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(back[i], 2 * rows[i] + 1) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertExchangeTest,
                         ::testing::Values(Case{1, 0}, Case{3, 0}, Case{1, 3}, Case{3, 2}),
                         [](const auto& info) {
                           return "held" + std::to_string(info.param.held) + "_capacity" +
                                  std::to_string(info.param.capacity);
                         });

}  // namespace
}  // namespace lockstep::parallel
