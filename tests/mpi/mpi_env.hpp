// The world communicator of a multi-rank test binary (set by mpi_main.cpp).
#pragma once

#include "src/comm/communicator.hpp"

namespace lockstep::test {
extern comm::Communicator* g_world;
}
