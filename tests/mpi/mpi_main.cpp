// main() of the multi-rank GoogleTest binaries: MPI up before the tests, down after; only rank 0
// prints the GoogleTest report, but every rank's failure makes the job exit non-zero (the exit
// status is the logical OR over ranks, so mpirun reports failure from any rank).
#include <gtest/gtest.h>

#include "src/comm/mpi_communicator.hpp"
#include "tests/mpi/mpi_env.hpp"

namespace lockstep::test {
comm::Communicator* g_world = nullptr;
}

int main(int argc, char** argv) {
  lockstep::comm::MpiRuntime mpi(&argc, &argv);
  int failed = 0;
  {
    auto world = mpi.world(/*timeout_s=*/60);
    lockstep::test::g_world = world.get();
    ::testing::InitGoogleTest(&argc, argv);
    if (world->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    int64_t mine = RUN_ALL_TESTS() != 0 ? 1 : 0;
    world->all_reduce(std::span<int64_t>(&mine, 1), lockstep::comm::ReduceOp::kMax);
    failed = static_cast<int>(mine);
    lockstep::test::g_world = nullptr;
  }
  return failed;
}
