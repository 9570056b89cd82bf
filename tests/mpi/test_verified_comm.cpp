// Verified collectives (verify/detect/verified_comm.hpp) under 2, 3 and 4 ranks: every operation
// gives the bits of the unverified one and records nothing on clean data — float sums included,
// with magnitudes spread over binades; a bit flipped in what the last rank receives is recorded
// there with the operation and the sender whose block it hit; the exact reduce-scatter survives a
// flipped count (three copies, majority) with its result unchanged; and the ranks agree on words
// whatever one copy of them holds (agreed.hpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/parallel/exact_reduce.hpp"
#include "tests/mpi/mpi_env.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/verified_comm.hpp"

namespace lockstep::detect {
namespace {

using test::g_world;

float value(int r, int64_t i) {
  const double x = std::sin(1.0 + 0.37 * static_cast<double>(i) + 11.0 * r);
  return static_cast<float>(std::ldexp(x, static_cast<int>(i % 41) - 20));
}

std::vector<float> data(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(r, i);
  return v;
}

// Runs every verified operation on `c` (floats of rank r), returning everything received.
std::vector<float> run_all(comm::Communicator& c) {
  const int p = c.size(), me = c.rank();
  const int64_t n = 1000;
  std::vector<float> out;
  const std::vector<float> mine = data(me, n);
  std::vector<float> sum(static_cast<size_t>(n));
  c.all_reduce(mine.data(), sum.data(), n, DType::kF32, comm::ReduceOp::kSum);
  out.insert(out.end(), sum.begin(), sum.end());
  std::vector<int64_t> ints(10, me + 1);
  c.all_reduce(std::span<int64_t>(ints), comm::ReduceOp::kSum);
  for (int64_t x : ints) out.push_back(static_cast<float>(x));
  const std::vector<int64_t> counts(static_cast<size_t>(p), n / p);
  std::vector<float> shard(static_cast<size_t>(n / p));
  const std::vector<float> full = data(me + 7, n / p * p);
  c.reduce_scatter(full.data(), shard.data(), counts, DType::kF32, comm::ReduceOp::kSum);
  out.insert(out.end(), shard.begin(), shard.end());
  std::vector<float> gathered(static_cast<size_t>(n * p));
  c.all_gather(mine.data(), gathered.data(), n, DType::kF32);
  out.insert(out.end(), gathered.begin(), gathered.end());
  std::vector<float> exchanged(static_cast<size_t>(n / p * p));
  c.all_to_all(full.data(), exchanged.data(), n / p, DType::kF32);
  out.insert(out.end(), exchanged.begin(), exchanged.end());
  std::vector<float> root = data(99, 50);
  if (me != 0) std::fill(root.begin(), root.end(), 0.0f);
  c.broadcast(root.data(), 50, DType::kF32, 0);
  out.insert(out.end(), root.begin(), root.end());
  return out;
}

TEST(VerifiedComm, SameBitsAndNothingRecordedOnCleanData) {
  CollectiveLog log;
  VerifiedCommunicator v(*g_world, log, true);
  const std::vector<float> plain = run_all(*g_world), checked = run_all(v);
  ASSERT_EQ(plain.size(), checked.size());
  EXPECT_EQ(0, std::memcmp(plain.data(), checked.data(), plain.size() * sizeof(float)));
  EXPECT_TRUE(log.take().empty());
  EXPECT_EQ(log.checked(), 6);
}

// A gather to one rank: rank r's r + 1 values (and text) reach the root only, in rank order, through
// the plain and the verified communicator alike.
TEST(VerifiedComm, GatherReachesTheRootOnly) {
  CollectiveLog log;
  VerifiedCommunicator v(*g_world, log, true);
  for (comm::Communicator* c : {static_cast<comm::Communicator*>(g_world), static_cast<comm::Communicator*>(&v)}) {
    const int p = c->size(), me = c->rank(), root = p - 1;
    const std::vector<float> mine = data(me, me + 1);
    std::vector<int64_t> counts;
    std::vector<float> want;
    for (int r = 0; r < p; ++r) {
      counts.push_back(r + 1);
      const std::vector<float> theirs = data(r, r + 1);
      want.insert(want.end(), theirs.begin(), theirs.end());
    }
    std::vector<float> got(me == root ? want.size() : 0);
    c->gatherv(mine.data(), me + 1, got.data(), counts, DType::kF32, root);
    const std::vector<std::string> texts = c->gather_text(std::string(static_cast<size_t>(me), 'x'), root);
    if (me != root) {
      EXPECT_TRUE(texts.empty());
      continue;
    }
    EXPECT_EQ(got, want);
    ASSERT_EQ(texts.size(), static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) EXPECT_EQ(texts[static_cast<size_t>(r)], std::string(static_cast<size_t>(r), 'x'));
  }
  EXPECT_TRUE(log.take().empty());
}

// The last rank's received messages get one bit flipped in the first word they hold from a peer,
// one operation at a time (the first element of every message here is small: its top exponent bit
// is clear).
TEST(VerifiedComm, AFlippedBitIsRecordedWithItsSender) {
  const int p = g_world->size(), last = p - 1;
  const std::string ops[] = {"all_reduce", "reduce_scatter", "all_gatherv", "all_to_allv", "broadcast"};
  for (const std::string& target : ops) {
    CollectiveLog log;
    VerifiedCommunicator v(*g_world, log, true, [&](std::string_view, std::string_view op,
                                                    std::span<const ReceivedBytes> blocks) {
      if (g_world->rank() != last || op != target) return;
      void* d = blocks.front().data;
      uint32_t w;
      std::memcpy(&w, d, 4);
      w ^= 1u << 30;  // the top exponent bit: 2^128 times larger or smaller
      std::memcpy(d, &w, 4);
    });
    run_all(v);
    const std::vector<CollectiveFault> f = log.take();
    if (g_world->rank() != last) {
      EXPECT_TRUE(f.empty()) << target;
      continue;
    }
    EXPECT_EQ(f.size(), target == "all_reduce" ? 2u : 1u) << target;  // all_reduce: of floats and of integers
    if (f.empty()) continue;  // (never return early: the other ranks go on to the next operation)
    EXPECT_EQ(f[0].op, target);
    EXPECT_EQ(f[0].receiver, last);
    // The first block the last rank receives from a peer is rank 0's (or the root's); a reduction
    // has no single sender.
    EXPECT_EQ(f[0].sender, target == "all_reduce" || target == "reduce_scatter" ? -1 : 0) << target;
  }
}

// A flipped bit in one copy of a count of the exact reduction's records: the majority of the three
// copies restores it, and the sum is the clean one.
TEST(VerifiedComm, ExactReductionSurvivesAFlippedCount) {
  const int p = g_world->size();
  const int64_t n = 640;
  std::vector<ParamTensor> layout(1);
  layout[0].name = std::string(1, 't');  // (a literal assignment trips a GCC 12 -Wrestrict false positive)
  layout[0].numel = n;
  layout[0].shape = {n};
  const parallel::ShardPlan plan = parallel::make_shard_plan(layout, p);
  ExactAccumulator local(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    local.add(static_cast<size_t>(i), static_cast<double>(value(g_world->rank(), i)));
    if (i % 5 == 0) local.add(static_cast<size_t>(i), std::ldexp(1.0, -140));  // spills: records to send
  }
  std::vector<float> clean(static_cast<size_t>(plan.size(g_world->rank()))), hit(clean.size());
  parallel::exact_reduce_scatter(local, plan, *g_world, clean.data());
  for (int bit : {0, 5, 40, 63}) {
    CollectiveLog log;
    int seen = 0;
    VerifiedCommunicator v(*g_world, log, false, [&](std::string_view, std::string_view op,
                                                     std::span<const ReceivedBytes> blocks) {
      if (g_world->rank() != p - 1 || op != "all_to_allv" || seen++ != 0) return;  // the counts
      void* d = blocks.front().data;
      uint64_t w;
      std::memcpy(&w, d, 8);
      w ^= uint64_t{1} << bit;
      std::memcpy(d, &w, 8);
    });
    parallel::exact_reduce_scatter(local, plan, v, hit.data());
    EXPECT_EQ(0, std::memcmp(clean.data(), hit.data(), clean.size() * sizeof(float))) << "bit " << bit;
  }
}

TEST(Agreed, EveryRankReadsEveryRanksWords) {
  const uint64_t mine[2] = {static_cast<uint64_t>(g_world->rank()) * 3 + 1, ~uint64_t{0}};
  const std::vector<uint64_t> all = agreed_all_gather(*g_world, mine);
  ASSERT_EQ(all.size(), 2 * static_cast<size_t>(g_world->size()));
  for (int r = 0; r < g_world->size(); ++r) {
    EXPECT_EQ(all[2 * static_cast<size_t>(r)], static_cast<uint64_t>(r) * 3 + 1);
    EXPECT_EQ(all[2 * static_cast<size_t>(r) + 1], ~uint64_t{0});
  }
  EXPECT_EQ(majority(0b1100, 0b1010, 0b0110), 0b1110u);  // each bit: two of three
  EXPECT_EQ(majority(42, 42, 0xdeadbeef), 42u);           // one copy wrong in any bits
}

}  // namespace
}  // namespace lockstep::detect
