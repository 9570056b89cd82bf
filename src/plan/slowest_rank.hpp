// The time a job takes for some work that every rank runs: the slowest rank's, from a barrier
// (the work ends for the job when it ends there). The collectives bench and the skew measurement
// time with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "src/comm/communicator.hpp"

namespace lockstep::plan {

// Seconds from a barrier to the end of `repetitions` runs of `body`, the highest over the ranks
// (every rank returns it).
inline double slowest_rank_seconds(comm::Communicator& world, int64_t repetitions, const std::function<void()>& body) {
  world.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < repetitions; ++i) body();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  world.all_reduce(&t, &t, 1, DType::kF64, comm::ReduceOp::kMax);
  return t;
}

}  // namespace lockstep::plan
