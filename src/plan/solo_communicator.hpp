// One rank of a group on its own, for timing its share of the work (compute_profile.hpp), as
// SoloTpGroup is for tensor parallelism: the group reports `size` ranks, so the plan gives this
// rank its blocks of the sequence, and each collective does this rank's local part — the copies
// into and out of its buffers — taking every other rank's contribution to be the one it sends
// itself. The values are not the group's; what it keeps is the cost of a rank's passes apart from
// the transfers, which the planner's collective model adds. The ring's point-to-point messages
// likewise: a receive gets the message of the same tag this rank sends, as its neighbour sends
// it the same share of the ring.
#pragma once

#include <string>
#include <vector>

#include "src/comm/communicator.hpp"

namespace lockstep::plan {

class SoloCommunicator final : public comm::Communicator {
 public:
  SoloCommunicator(int size, std::string name);
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  double timeout_s() const override { return 0; }
  bool concurrent_threads() const override { return true; }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override;
  comm::Handle iall_reduce(const void* send, void* recv, int64_t count, DType t, comm::ReduceOp op) override;
  comm::Handle ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts, DType t,
                               comm::ReduceOp op) override;
  comm::Handle iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                            std::span<const int64_t> displs, DType t) override;
  comm::Handle iall_to_allv(const void* send, std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_displs, void* recv, std::span<const int64_t> recv_counts,
                            std::span<const int64_t> recv_displs, DType t) override;
  comm::Handle ibroadcast(void* buf, int64_t count, DType t, int root) override;
  comm::Handle isend(const void* buf, int64_t count, DType t, int dest, int tag) override;
  comm::Handle irecv(void* buf, int64_t count, DType t, int source, int tag) override;
  comm::Handle ibarrier() override { return comm::Handle(); }

 private:
  // A send or a receive not matched yet (one of the two pointers set).
  struct Unmatched {
    const void* send = nullptr;
    void* recv = nullptr;
    int64_t count = 0;
    DType t = DType::kF32;
    int tag = 0;
  };
  // Pairs `m` with the unmatched message of the other direction and the same tag, copying the
  // sent elements into the receive's buffer; keeps it for its partner where there is none yet.
  void match(const Unmatched& m);

  std::string name_;
  std::vector<int> world_ranks_;
  std::vector<Unmatched> unmatched_;
};

}  // namespace lockstep::plan
