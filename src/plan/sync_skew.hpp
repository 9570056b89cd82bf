// The ranks' skew at their synchronisations, measured (`lockstep bench --collectives`; the
// planner's cost model prices it, cost_model.hpp). A collective ends for every rank when the last
// one arrives, so each one costs the ranks what their compute since the one before differed by:
// on a machine whose cores' speed moves under other tenants, the same work takes a little longer on
// one rank than on the other, differently each time. No figure the planner reads holds it — a
// rank's passes are timed alone, each rank's median over repeats; the collectives back to back,
// the ranks already in step.
//
// Measured as the trainer meets it: every rank computes the same segment (a canonical product of
// about a millisecond on one thread, as a rank of the local cluster computes) and then all-reduces
// 4 KiB, `segments` times; in the same round, the segments alone on every rank at once and the
// all-reduces alone, back to back. What the pairs take beyond the two apart, over the segments'
// time, is the share of the compute that waiting for the slowest rank adds. Rounds alternate
// which of the three runs first; the median over the rounds is kept (the machine's state moves
// from one to the next).
#pragma once

#include <cstdint>

#include "kernels/backend.hpp"
#include "src/comm/communicator.hpp"

namespace lockstep::plan {

struct SyncSkew {
  double share = 0;            // of the compute between synchronisations: the rounds' median
  double segment_seconds = 0;  // one segment's time, the rounds' median
  int64_t rounds = 0;
};

// Every rank returns the same figures; a world of one has no skew (share 0).
SyncSkew measure_sync_skew(comm::Communicator& world, Backend& backend, int64_t rounds, int64_t segments = 40);

}  // namespace lockstep::plan
