#include "src/plan/collective_bench.hpp"

#include <algorithm>
#include <functional>
#include <string>

#include "src/core/check.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/plan/slowest_rank.hpp"
#include "src/train/bench.hpp"

namespace lockstep::plan {

Link fit_ring_all_reduce(const std::vector<CollectiveSample>& samples, int64_t n) {
  LS_REQUIRE(samples.size() >= 2 && n >= 2, "fit_ring_all_reduce: needs two sizes and two ranks");
  // t = c0 + c1·S: ordinary least squares, then α = c0 / 2(n−1), 1/β = c1 / (2(n−1)/n).
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CollectiveSample& s : samples) {
    sx += s.bytes;
    sy += s.seconds;
    sxx += s.bytes * s.bytes;
    sxy += s.bytes * s.seconds;
  }
  const auto m = static_cast<double>(samples.size());
  const double c1 = (m * sxy - sx * sy) / (m * sxx - sx * sx);
  const double c0 = (sy - c1 * sx) / m;
  const double k = static_cast<double>(n - 1);
  constexpr double kTiny = 1e-12;
  return {2 * k / static_cast<double>(n) / std::max(c1, kTiny), std::max(c0, kTiny) / (2 * k)};
}

CollectiveBench bench_collectives(comm::Communicator& world, Backend& backend, int64_t repeats, double largest_bytes) {
  LS_REQUIRE(repeats >= 1, "lockstep bench --collectives: repeats must be >= 1");
  CollectiveBench r;
  r.ranks = world.size();
  if (r.ranks == 1) return r;  // nothing to send
  // Sizes 4 KiB · 4^k up to the first that holds largest_bytes, two at least (the fit's).
  int64_t max_floats = int64_t{1} << 12;
  while (max_floats < kMaxCollectiveFloats && 4 * static_cast<double>(max_floats) < largest_bytes) max_floats *= 4;
  std::vector<float> buffer(static_cast<size_t>(max_floats), 1.0f), gather_send(buffer);
  ExactAccumulator exact, shard_sums;
  parallel::CommTpGroup group(world);
  // The median over the repeats of the slowest rank's time of one collective of `floats`.
  const auto timed = [&](int64_t floats, const std::function<void()>& collective) {
    // Small collectives back to back, as a step issues them, so that the ranks' skew leaving the
    // barrier is spread over several (nccl-tests times its iterations the same way); from a MiB
    // on, a collective lasts long enough beside that skew.
    const int64_t back_to_back = floats < (int64_t{1} << 18) ? 10 : 2;
    std::vector<double> times;
    for (int64_t i = 0; i <= repeats; ++i) {
      const double t = slowest_rank_seconds(world, back_to_back, collective) / static_cast<double>(back_to_back);
      if (i > 0) times.push_back(t);
    }
    return stats_of(times).median;
  };
  // The same, one collective at a time after the rank has rewritten a buffer larger than its
  // caches: a step's passes stream their tensors between two of ZeRO-3's layer gathers, which
  // read a shard and fill a window that the caches no longer hold (several times the cache-hot
  // collective's time on a CPU). One at a time, each carries the ranks' skew leaving the barrier,
  // which back to back is spread; without the rewrite that costs a 528 KiB gather 1-3 us of its
  // 22 here, the rewrite 100 or more.
  std::vector<float> evicting(kEvictionBytes / sizeof(float), 0.0f);
  const auto evicted = [&](const std::function<void()>& collective) {
    std::vector<double> times;
    for (int64_t i = 0; i <= repeats; ++i) {
      for (float& x : evicting) x += 1.0f;
      asm volatile("" : : "r"(evicting.data()) : "memory");  // the stores happen: nothing reads them
      const double t = slowest_rank_seconds(world, 1, collective);
      if (i > 0) times.push_back(t);
    }
    return stats_of(times).median;
  };
  for (int64_t floats = 1 << 10; floats <= max_floats; floats *= 4) {
    const double bytes = static_cast<double>(floats) * 4;
    r.all_reduce.push_back({bytes, timed(floats, [&] {
                              world.all_reduce(buffer.data(), buffer.data(), floats, DType::kF32, comm::ReduceOp::kSum);
                            })});
    // The whole buffer gathered from the ranks' equal parts (the last takes the rest), from a
    // separate send buffer as ZeRO's gathers send.
    std::vector<int64_t> counts(static_cast<size_t>(r.ranks), floats / r.ranks), displs;
    counts.back() += floats % r.ranks;
    for (int64_t q = 0; q < r.ranks; ++q) displs.push_back(q * (floats / r.ranks));
    const auto gather = [&] { world.all_gatherv(gather_send.data(), buffer.data(), counts, displs, DType::kF32); };
    r.all_gather.push_back({bytes, timed(floats, gather)});
    r.layer_gather.push_back({bytes, evicted(gather)});
    exact.reset(static_cast<size_t>(floats));
    for (size_t i = 0; i < exact.size(); ++i) exact.add(i, 1.0 + static_cast<double>(i % 7));
    r.exact_all_reduce.push_back({bytes, timed(floats, [&] { group.all_reduce_exact(exact, buffer.data()); })});
    // ZeRO-2's reduction of a bucket: every rank's exact sums added into the owners' running exact
    // sums, which stay unrounded until the step's last micro-batch. The shards are contiguous
    // ranges of the gradient and the trainer reduces a bucket's window of them: a bucket as large
    // as the gradient is split evenly, but one smaller than a shard lies in one rank's shard, and
    // that rank receives and adds all of it — each rank in turn here, call by call.
    parallel::ShardPlan even;
    std::vector<parallel::ShardPlan> owned(static_cast<size_t>(r.ranks));  // owned[o]: all of it rank o's
    for (int64_t q = 0; q <= r.ranks; ++q) {
      even.begin.push_back(q * floats / r.ranks);
      for (int64_t o = 0; o < r.ranks; ++o) owned[static_cast<size_t>(o)].begin.push_back(q > o ? floats : 0);
    }
    shard_sums.reset(static_cast<size_t>(floats));
    r.exact_reduce_scatter.push_back(
        {bytes, timed(floats, [&] { parallel::exact_reduce_scatter_add(exact, even, world, shard_sums, 0, 0); })});
    int64_t call = 0;
    r.exact_reduce_scatter_owned.push_back({bytes, timed(floats, [&] {
                                              const parallel::ShardPlan& plan = owned[static_cast<size_t>(call++ % r.ranks)];
                                              parallel::exact_reduce_scatter_add(exact, plan, world, shard_sums, 0, 0);
                                            })});
    // Fast mode's: the fp32 values themselves to their owners (into a buffer of the whole, which
    // an owner of all of it needs).
    r.exact_fp32_reduce_scatter.push_back(
        {bytes, timed(floats, [&] { parallel::exact_reduce_scatter(buffer.data(), even, world, gather_send.data()); })});
    r.exact_fp32_reduce_scatter_owned.push_back({bytes, timed(floats, [&] {
                                                   const parallel::ShardPlan& plan = owned[static_cast<size_t>(call++ % r.ranks)];
                                                   parallel::exact_reduce_scatter(buffer.data(), plan, world, gather_send.data());
                                                 })});
  }
  r.fit = fit_ring_all_reduce(r.all_reduce, r.ranks);
  r.skew = measure_sync_skew(world, backend, std::max<int64_t>(repeats, 7));
  return r;
}

nlohmann::json CollectiveBench::to_json() const {
  const auto samples = [](const std::vector<CollectiveSample>& v) {
    nlohmann::json out = nlohmann::json::array();
    for (const CollectiveSample& s : v) out.push_back({{"bytes", s.bytes}, {"seconds", s.seconds}});
    return out;
  };
  return {{"ranks", ranks},
          {"all_reduce", samples(all_reduce)},
          {"all_gather", samples(all_gather)},
          {"layer_gather", samples(layer_gather)},
          {"exact_all_reduce", samples(exact_all_reduce)},
          {"exact_reduce_scatter", samples(exact_reduce_scatter)},
          {"exact_reduce_scatter_owned", samples(exact_reduce_scatter_owned)},
          {"exact_fp32_reduce_scatter", samples(exact_fp32_reduce_scatter)},
          {"exact_fp32_reduce_scatter_owned", samples(exact_fp32_reduce_scatter_owned)},
          {"latency_us", fit.latency * 1e6},
          {"bandwidth_gbs", fit.bandwidth / 1e9},
          {"sync_skew", skew.share},
          {"sync_skew_segment_us", skew.segment_seconds * 1e6},
          {"sync_skew_rounds", skew.rounds}};
}

CollectiveBench collective_bench_from_json(const nlohmann::json& j, const std::string& where) {
  CollectiveBench r;
  try {
    r.ranks = j.at("ranks").get<int64_t>();
    const auto read = [&](const char* key, std::vector<CollectiveSample>& out) {
      for (const auto& s : j.at(key)) out.push_back({s.at("bytes"), s.at("seconds")});
    };
    read("all_reduce", r.all_reduce);
    read("all_gather", r.all_gather);
    read("layer_gather", r.layer_gather);
    read("exact_all_reduce", r.exact_all_reduce);
    read("exact_reduce_scatter", r.exact_reduce_scatter);
    read("exact_reduce_scatter_owned", r.exact_reduce_scatter_owned);
    read("exact_fp32_reduce_scatter", r.exact_fp32_reduce_scatter);
    read("exact_fp32_reduce_scatter_owned", r.exact_fp32_reduce_scatter_owned);
    LS_REQUIRE(r.ranks >= 1 && (r.ranks == 1 || r.all_reduce.size() >= 2), where,
               ": expected ranks >= 1 and, for more than one, two sizes or more");
    r.fit = {j.at("bandwidth_gbs").get<double>() * 1e9, j.at("latency_us").get<double>() * 1e-6};
    r.skew = {j.at("sync_skew").get<double>(), j.at("sync_skew_segment_us").get<double>() * 1e-6,
              j.at("sync_skew_rounds").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(where, ": not a `lockstep bench --collectives` report (", e.what(), ")"));
  }
  return r;
}

}  // namespace lockstep::plan
