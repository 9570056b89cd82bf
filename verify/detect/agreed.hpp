// Agreement under a corrupted message: what the ranks must decide together (whether a step found a
// fault, whether to stop) cannot rest on one copy of a message, or a flipped bit in it would make
// one rank decide otherwise than the rest and leave them waiting for it. Each rank's words are sent
// three times and every receiver takes the bitwise majority of the copies — right whatever the
// corruption of any one copy — so every rank reads the same values.
// Not here: the checks of bulk data (verified_comm.hpp), which detect rather than correct.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/core/majority.hpp"

namespace lockstep::detect {

// Every rank's `mine` (the same length on every rank), in rank order.
std::vector<uint64_t> agreed_all_gather(comm::Communicator& comm, std::span<const uint64_t> mine);

}  // namespace lockstep::detect
