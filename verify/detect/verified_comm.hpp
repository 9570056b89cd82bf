// Verified collectives ([verify] collectives): a communicator that passes every operation to the
// run's own and carries a checksum beside its data, checked by every receiver before the caller
// sees the result —
//
//   all-gather(v), all-to-all(v), broadcast, send/recv   the block hash (checksum.hpp) of each sender's block, sent by a
//       companion operation of the same kind; a received block whose hash differs names its sender
//       (a rank's own block, copied locally, is not a message and is not hashed);
//   all-reduce, reduce-scatter with a sum                 integers: the sum of the ranks' checksums
//       (Σ of their elements, modulo 2^64) equals the result's, exactly; floats: each rank's Σ x and
//       Σ |x| (in double) are gathered and the result's sum must lie within γ_{p−1}·Σ_r Σ |x| of Σ_r
//       Σ x (p − 1 roundings per element, in the format reduced), plus the checksums' own rounding;
//   max and min reductions, barriers                      not checked (small control values).
//
// A failed check is recorded in a CollectiveLog (the operation, the group, this rank, the peer)
// and the result is handed on as it is: its consumers must survive any bits (the exact reduction
// votes on its counts and refuses records out of range: src/parallel/exact_reduce.hpp).
// CollectiveDetector, a step observer, gathers every rank's records after the gradient reduction
// and after the update and reports them as findings (class corruption) that every rank reaches
// together.
//
// A receive hook sees each received buffer after the operation and before the check: [inject]'s
// collective sites flip a bit there, as a fault on the wire or in the receiving NIC would.
// Not here: the MPI calls (src/comm), what the messages mean (src/parallel).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

// One message that failed its check, as the receiving rank saw it.
struct CollectiveFault {
  std::string op;      // "all_to_allv", "all_gatherv", "reduce_scatter", ...
  std::string group;   // "dp", "tp", ...
  int receiver = -1;   // world rank
  int sender = -1;     // world rank of the block's sender; -1: a reduction (no single sender)
  double magnitude = 0, bound = 0;  // reductions of floats: |Σ result − Σ checksums| and its bound
};

// The records of one rank's verified groups (thread-safe: the gradient buckets reduce on a thread
// of their own).
class CollectiveLog {
 public:
  void record(CollectiveFault f);
  std::vector<CollectiveFault> take();
  void count_checked();
  int64_t checked() const;

 private:
  mutable std::mutex mutex_;
  std::vector<CollectiveFault> faults_;
  int64_t checked_ = 0;
};

// What a rank received from its peers in one operation (its own block of a gather or an
// all-to-all, copied locally, is not among them).
struct ReceivedBytes {
  void* data;
  int64_t bytes;
};
// Sees a received message before it is checked: (group, op, its blocks).
using ReceiveHook =
    std::function<void(std::string_view group, std::string_view op, std::span<const ReceivedBytes> blocks)>;

class VerifiedCommunicator final : public comm::Communicator {
 public:
  // Wraps `inner` (which must outlive it). check false: no checksums, only the receive hook.
  VerifiedCommunicator(comm::Communicator& inner, CollectiveLog& log, bool check, ReceiveHook hook = {});

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  double timeout_s() const override { return inner_->timeout_s(); }
  bool concurrent_threads() const override { return inner_->concurrent_threads(); }
  // The split groups are verified as well.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

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
  comm::Handle ibarrier() override { return inner_->ibarrier(); }

 private:
  VerifiedCommunicator(std::unique_ptr<comm::Communicator> owned, CollectiveLog& log, bool check, ReceiveHook hook);
  // An operation passed on unchecked; the hook sees its received blocks.
  comm::Handle unchecked(comm::Handle op, const char* name, std::vector<ReceivedBytes> blocks);
  // The operation's handle, then its companion's, then the check (recorded in the log).
  comm::Handle verified(comm::Handle op, comm::Handle companion, std::function<void()> check);
  // Bytes the inner group sent since `before`, counted here too.
  void count_bytes(const comm::CommStats& before);
  void fault(const char* op, int sender_group_rank, double magnitude = 0, double bound = 0);
  void received(const char* op, const std::vector<ReceivedBytes>& blocks) const;

  std::unique_ptr<comm::Communicator> owned_;
  comm::Communicator* inner_;
  CollectiveLog& log_;
  bool check_;
  ReceiveHook hook_;
};

// Reports every rank's failed messages after the gradient reduction of each step: one finding per
// operation and group, naming the receiving ranks and the senders whose blocks failed.
class CollectiveDetector final : public StepObserver {
 public:
  CollectiveDetector(CollectiveLog& log, comm::Communicator& world, FindingLog& findings, FaultAction action)
      : log_(log), world_(world), findings_(findings), action_(action) {}
  void after_reduce(int64_t step, float loss) override;
  // The update's messages (ZeRO's all-gather of the parameters), before anything keeps its result.
  void after_update(int64_t step) override { report(step); }
  void rolled_back(int64_t) override { log_.take(); }

 private:
  void report(int64_t step);
  CollectiveLog& log_;
  comm::Communicator& world_;
  FindingLog& findings_;
  FaultAction action_;
};

}  // namespace lockstep::detect
