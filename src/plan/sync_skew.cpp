#include "src/plan/sync_skew.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

#include "src/core/check.hpp"
#include "src/plan/slowest_rank.hpp"
#include "src/train/bench.hpp"

namespace lockstep::plan {

SyncSkew measure_sync_skew(comm::Communicator& world, Backend& backend, int64_t rounds, int64_t segments) {
  LS_REQUIRE(rounds >= 1 && segments >= 1, "measure_sync_skew: rounds and segments must be >= 1");
  SyncSkew r;
  if (world.size() == 1) return r;
  // The segment: a 256 x 512 x 512 product (134 MFLOP), its operands cache-resident.
  const LinearShape shape{256, 512, 512};
  std::vector<float> inp(static_cast<size_t>(shape.N * shape.IC)), w(static_cast<size_t>(shape.OC * shape.IC)),
      out(static_cast<size_t>(shape.N * shape.OC));
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 11) * 0.0625f - 0.3125f;
  const auto segment = [&] { backend.linear_forward(Mode::kCanonical, shape, out.data(), inp.data(), w.data(), nullptr); };
  std::vector<float> message(1024);  // 4 KiB of zeros: their sums stay zeros, however many
  const auto all_reduce = [&] {
    world.all_reduce(message.data(), message.data(), static_cast<int64_t>(message.size()), DType::kF32,
                     comm::ReduceOp::kSum);
  };
  slowest_rank_seconds(world, segments, segment);  // warms the caches and the cores
  const std::array<std::function<void()>, 3> bodies = {segment, all_reduce, [&] {
                                                         segment();
                                                         all_reduce();
                                                       }};
  std::vector<double> shares, segment_times;
  for (int64_t round = 0; round < rounds; ++round) {
    std::array<double, 3> t{};  // the segments apart, the all-reduces apart, the pairs
    for (size_t k = 0; k < bodies.size(); ++k) {
      const size_t which = (k + static_cast<size_t>(round)) % bodies.size();
      t[which] = slowest_rank_seconds(world, segments, bodies[which]);
    }
    shares.push_back((t[2] - t[0] - t[1]) / t[0]);
    segment_times.push_back(t[0] / static_cast<double>(segments));
  }
  // A negative median is the machine's state moving between the parts of the rounds: waiting for
  // another rank never makes a step faster.
  r.share = std::max(0.0, stats_of(shares).median);
  r.segment_seconds = stats_of(segment_times).median;
  r.rounds = rounds;
  return r;
}

}  // namespace lockstep::plan
