// Tensor-parallel collectives under 2, 3 and 4 ranks (the whole world as the tp group):
//  - CommTpGroup's exact all-reduce and reduce-scatter give the bits of one process summing every
//    rank's partials exactly, also for elements whose sums spill to a SuperAccumulator; the fp32
//    sums are exact where one rank holds the value and the others -0.0f;
//  - gather_global of the shards taken by take_local is the global buffer again;
//  - sum_norm_grads leaves every rank with the exact sum over the group of the norm gradients
//    (spilled ones included) and the other gradients untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/core/formats.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/parallel/tp_plan.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::parallel {
namespace {

using test::g_world;

// Partial k of element e from rank r: magnitudes from 2^-100 to 2^100 in one element every third
// element (its double sum is inexact: the accumulator spills), small integers otherwise.
float partial(int r, int64_t e, int k) {
  const int64_t h = (r * 7919 + e * 104729 + k * 1299709) % 1000003;
  if (e % 3 != 0) return static_cast<float>(h % 201 - 100);
  return std::ldexp(static_cast<float>(h % 2 == 0 ? 1 : -1) * (1.0f + static_cast<float>(h % 97) / 128.0f),
                    static_cast<int>(h % 201) - 100);
}

constexpr int kPartials = 3;

float exact_total(int ranks, int64_t e) {
  SuperAccumulator s;
  for (int r = 0; r < ranks; ++r)
    for (int k = 0; k < kPartials; ++k) s.add(static_cast<double>(partial(r, e, k)));
  return s.round_to_float();
}

TEST(TensorParallelMpi, ExactAllReduceAndReduceScatterGiveOneProcessBits) {
  CommTpGroup tp(*g_world);
  const int p = g_world->size(), me = g_world->rank();
  const int64_t n_local = 37, n = n_local * p;
  ExactAccumulator acc(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e)
    for (int k = 0; k < kPartials; ++k) acc.add(static_cast<size_t>(e), partial(me, e, k));
  ASSERT_GT(acc.spill_count(), 0u) << "the test must exercise spilled sums";
  std::vector<float> all(static_cast<size_t>(n)), mine(static_cast<size_t>(n_local));
  tp.all_reduce_exact(acc, all.data());
  tp.reduce_scatter_exact(acc, mine.data());
  for (int64_t e = 0; e < n; ++e) {
    ASSERT_EQ(f32_bits(all[static_cast<size_t>(e)]), f32_bits(exact_total(p, e))) << "all_reduce_exact element " << e;
  }
  for (int64_t i = 0; i < n_local; ++i) {
    ASSERT_EQ(f32_bits(mine[static_cast<size_t>(i)]), f32_bits(exact_total(p, me * n_local + i))) << "reduce_scatter_exact " << i;
  }
}

TEST(TensorParallelMpi, SumsWithOneOwnerAreTheOwnersValue) {
  CommTpGroup tp(*g_world);
  const int p = g_world->size(), me = g_world->rank();
  const int64_t n_local = 5, n = n_local * p;
  // Element e belongs to rank e % p; values include -0.0f and subnormals, kept exactly.
  auto value = [](int64_t e) { return e % 4 == 0 ? -0.0f : std::ldexp(static_cast<float>(e) - 7.5f, -140 + e % 3 * 100); };
  std::vector<float> x(static_cast<size_t>(n)), local(static_cast<size_t>(n_local)), gathered(x.size());
  for (int64_t e = 0; e < n; ++e) x[static_cast<size_t>(e)] = e % p == me ? value(e) : -0.0f;
  std::vector<float> y = x;
  tp.reduce_scatter_sum(x.data(), local.data(), n_local);
  tp.all_reduce_sum(y.data(), n);
  tp.all_gather(local.data(), gathered.data(), n_local);
  for (int64_t e = 0; e < n; ++e) {
    ASSERT_EQ(f32_bits(y[static_cast<size_t>(e)]), f32_bits(value(e))) << "all_reduce_sum element " << e;
    ASSERT_EQ(f32_bits(gathered[static_cast<size_t>(e)]), f32_bits(value(e))) << "reduce_scatter_sum + all_gather " << e;
  }
}

ModelConfig model() {
  ModelConfig m;
  m.vocab_size = 64 * 12;  // divisible by 2, 3 and 4 ranks
  m.seq_len = 16;
  m.d_model = 12 * 16;
  m.n_layers = 1;
  m.n_heads = 12;
  m.n_kv_heads = 12;
  m.ffn = FfnKind::kSwiglu;
  m.ffn_hidden = 12 * 8;
  m.tie_embeddings = false;
  return m;
}

TEST(TensorParallelMpi, GatherOfTakenShardsIsTheGlobalBuffer) {
  const ModelConfig m = model();
  const int p = g_world->size(), me = g_world->rank();
  const std::vector<ParamTensor> global = build_param_layout(m), local = build_param_layout(m, {p, me});
  std::vector<float> g(static_cast<size_t>(global.back().offset + global.back().numel));
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  std::vector<float> l(static_cast<size_t>(local.back().offset + local.back().numel));
  take_local(m, local, g.data(), l.data());
  EXPECT_EQ(gather_global(m, local, l.data(), *g_world), g);
}

TEST(TensorParallelMpi, NormGradientsAreSummedExactlyOverTheGroup) {
  CommTpGroup tp(*g_world);
  const TensorParallelPlan plan(tp, true);
  const int p = g_world->size(), me = g_world->rank();
  Model gpt(model(), Mode::kCanonical, 1, {.plan = &plan});
  ExactAccumulator& acc = gpt.exact_grads();
  const auto n = static_cast<int64_t>(acc.size());
  for (int64_t e = 0; e < n; ++e)
    for (int k = 0; k < kPartials; ++k) acc.add(static_cast<size_t>(e), partial(me, e, k));
  sum_norm_grads(gpt, *g_world);
  int64_t norms = 0;
  for (const auto& t : gpt.param_layout()) {
    for (int64_t i = 0; i < t.numel; ++i) {
      const int64_t e = t.offset + i;
      float want;
      if (t.is_norm()) {
        want = exact_total(p, e);
      } else {
        SuperAccumulator s;
        for (int k = 0; k < kPartials; ++k) s.add(static_cast<double>(partial(me, e, k)));
        want = s.round_to_float();
      }
      ASSERT_EQ(f32_bits(acc.round(static_cast<size_t>(e))), f32_bits(want)) << t.name << " element " << i;
    }
    norms += t.is_norm() ? t.numel : 0;
  }
  EXPECT_EQ(norms, 3 * 2 * 192);  // ln1, ln2, lnf: weight and bias
}

}  // namespace
}  // namespace lockstep::parallel
