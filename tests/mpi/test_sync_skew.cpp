// The ranks' skew at a synchronisation (src/plan/sync_skew.hpp), measured against a planted one:
// every segment takes D longer on one rank, the ranks in turn, so that apart both ranks compute
// the same total while paired with an all-reduce each segment waits D for the other rank. The
// share measured is then what that adds, (D/2) over the mean segment, beside the machine's own.
#include <gtest/gtest.h>

#include <chrono>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/forwarding_backend.hpp"
#include "src/plan/sync_skew.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::plan {
namespace {

using test::g_world;

// Each linear_forward of a rank's turn (call n on rank n % ranks) busy-waits `extra` after the
// product, as a slower core would compute.
class SkewedBackend final : public ForwardingBackend {
 public:
  SkewedBackend(Backend& inner, int rank, int ranks, std::chrono::microseconds extra)
      : ForwardingBackend(inner), rank_(rank), ranks_(ranks), extra_(extra) {}

  void linear_forward(Mode mode, LinearShape s, float* out, const float* inp, const float* weight,
                      const float* bias) override {
    inner().linear_forward(mode, s, out, inp, weight, bias);
    if (calls_++ % ranks_ != rank_) return;
    const auto until = std::chrono::steady_clock::now() + extra_;
    while (std::chrono::steady_clock::now() < until) {
    }
  }

 private:
  int rank_, ranks_;
  int64_t calls_ = 0;
  std::chrono::microseconds extra_;
};

TEST(SyncSkew, FindsAPlantedSkew) {
  CpuBackend cpu(CpuSettings{1});
  const SyncSkew clean = measure_sync_skew(*g_world, cpu, 5);
  ASSERT_GT(clean.segment_seconds, 0);
  EXPECT_GE(clean.share, 0);
  // D as long as a segment: the pairs wait half of the mean segment (D/2 of seg + D/2) each time.
  const auto extra = std::chrono::microseconds(static_cast<int64_t>(clean.segment_seconds * 1e6));
  SkewedBackend skewed(cpu, g_world->rank(), g_world->size(), extra);
  const SyncSkew planted = measure_sync_skew(*g_world, skewed, 5);
  const double added = (static_cast<double>(extra.count()) * 1e-6 * (g_world->size() - 1) / g_world->size()) /
                       planted.segment_seconds;
  EXPECT_GT(planted.share, 0.7 * added) << "clean " << clean.share;
  EXPECT_LT(planted.share, 1.5 * added) << "clean " << clean.share;
}

}  // namespace
}  // namespace lockstep::plan
