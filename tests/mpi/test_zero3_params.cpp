// ZeRO-3 parameter storage (src/parallel/zero3_params.hpp) on the whole world as the dp group (2,
// 3 and 4 ranks), tied and untied embeddings, with and without the gathering worker:
//  - every gather gives each of the layer's tensors bitwise as a model holding them whole has them,
//    whatever order the layers are asked for in and whatever `next` guessed (right, wrong, the
//    same layer, none) — a window must never serve a layer it does not hold;
//  - after the shard changes and invalidate(), gathers give the new values (no stale window);
//  - hold_whole() gives the whole buffer, and release_whole() writes this rank's part of it back.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "src/core/hash.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/zero3_params.hpp"
#include "tests/mpi/mpi_env.hpp"
#include "tests/unit/parallel/small_model.hpp"

namespace lockstep::parallel {
namespace {

using test::g_world;

// Every tensor of the layer, where the storage put it, bitwise equal to `whole` (offset + delta).
void expect_layer(const Model& sharded, size_t layer, std::span<float* const> where, const std::vector<float>& whole,
                  const std::string& context) {
  const std::vector<const ParamTensor*>& tensors = sharded.layer_params(layer);
  ASSERT_EQ(where.size(), tensors.size()) << context;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ParamTensor& t = *tensors[k];
    EXPECT_EQ(std::memcmp(where[k], whole.data() + t.offset, static_cast<size_t>(t.numel) * sizeof(float)), 0)
        << context << ": layer " << layer << " tensor " << t.name;
  }
}

struct Case {
  bool tied;
  bool threaded;
};

class Zero3ParamsMpi : public ::testing::TestWithParam<Case> {};

TEST_P(Zero3ParamsMpi, GathersGiveTheWholeParametersInAnyOrder) {
  const Case c = GetParam();
  if (c.threaded && !g_world->concurrent_threads()) GTEST_SKIP() << "no MPI_THREAD_MULTIPLE";
  const ModelConfig cfg = small_model(c.tied);
  Model whole_model(cfg, Mode::kCanonical, 1);
  whole_model.init_parameters();
  std::vector<float> whole(whole_model.params(), whole_model.params() + whole_model.num_params());

  Model sharded(cfg, Mode::kCanonical, 1, {.sharded_params = true});
  ASSERT_EQ(sharded.params(), nullptr);
  const ShardPlan plan = make_shard_plan(sharded.param_layout(), g_world->size());
  Zero3Params storage(sharded, *g_world, plan, c.threaded);
  sharded.init_parameters(storage.shard_first(), storage.shard_end(), storage.shard());

  // A forward, a backward, and requests in an order no pass makes, with guesses right and wrong;
  // every rank asks for the same sequence (the gathers are collective).
  const size_t L = sharded.num_layers();
  std::vector<std::pair<size_t, size_t>> asks;
  for (size_t l = 0; l < L; ++l) asks.emplace_back(l, l + 1 < L ? l + 1 : SIZE_MAX);
  for (size_t l = L; l-- > 0;) asks.emplace_back(l, l > 0 ? l - 1 : 0);
  for (uint64_t i = 0; i < 40; ++i) {
    const uint64_t h = xxh64(&i, sizeof i, 3);
    const size_t next = h % 4 == 0 ? SIZE_MAX : static_cast<size_t>((h >> 8) % L);
    asks.emplace_back(static_cast<size_t>((h >> 32) % L), next);
  }
  for (size_t a = 0; a < asks.size(); ++a) {
    const auto [layer, next] = asks[a];
    expect_layer(sharded, layer, storage.gather(layer, next), whole, str_cat("request ", a));
  }

  // The shard changes (as an update changes it): after invalidate(), the new values.
  for (float& x : std::span<float>(storage.shard(), static_cast<size_t>(storage.shard_end() - storage.shard_first()))) {
    x = x * 0.5f + 1.0f;
  }
  for (float& x : whole) x = x * 0.5f + 1.0f;
  storage.invalidate();
  for (size_t l = 0; l < L; ++l) expect_layer(sharded, l, storage.gather(l, l + 1 < L ? l + 1 : SIZE_MAX), whole, "after invalidate");

  // The whole buffer, edited and released: this rank's part goes back to its shard.
  storage.hold_whole();
  ASSERT_NE(sharded.params(), nullptr);
  EXPECT_EQ(std::memcmp(sharded.params(), whole.data(), whole.size() * sizeof(float)), 0) << "hold_whole";
  for (int64_t i = 0; i < sharded.num_params(); ++i) sharded.params()[i] += 2.0f;
  for (float& x : whole) x += 2.0f;
  storage.release_whole();
  EXPECT_EQ(sharded.params(), nullptr);
  for (size_t l = L; l-- > 0;) expect_layer(sharded, l, storage.gather(l, l > 0 ? l - 1 : SIZE_MAX), whole, "after release_whole");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Zero3ParamsMpi,
                         ::testing::Values(Case{false, false}, Case{false, true}, Case{true, false}, Case{true, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.tied ? "Tied" : "Untied") + (i.param.threaded ? "Worker" : "Inline");
                         });

}  // namespace
}  // namespace lockstep::parallel
