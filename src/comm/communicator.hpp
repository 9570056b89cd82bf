// Communicator: the device-agnostic interface every collective in Lockstep goes through.
//
// A Communicator is one group of ranks (the world, or a mesh axis such as the dp group). It offers
// the collectives the parallel layers need — all-reduce, reduce-scatter, all-gather(v),
// all-to-all(v), broadcast, send/recv, barrier — each in a non-blocking form `i...` that returns a
// Handle, and a blocking form that starts the operation and waits for it.
//
// Waiting is watched: Handle::wait() gives up after the communicator's timeout and ends the whole
// job with a message naming this rank, the operation, the group and its members ("rank 1:
// all_reduce on dp group (world ranks 0,1) did not complete in 30 s; a peer may have died or hung"),
// never a silent hang.
//
// Threads: one group's operations are started and waited for by one thread at a time; different
// groups may be driven by different threads where concurrent_threads() says so.
//
// Numerics: ReduceOp::kSum on floating-point data is *not* reproducible (the backend may sum in any
// order, and differently on different ranks). Reproducible reductions are built on top of this
// interface from exact representations (src/parallel/exact_reduce.hpp), using kSum only on
// integers or not at all.
//
// Byte accounting: every operation adds to stats() the bytes this rank must send under a
// bandwidth-optimal algorithm (ring all-gather / reduce-scatter: (p-1)/p of the total; all-reduce:
// twice that; all-to-all: the blocks addressed to other ranks; send: the message) — the figure the
// trainer reports per step and compares with the theoretical minimum. The backend's actual traffic
// depends on its algorithm choice.
//
// Not here: the MPI calls (src/comm/mpi_communicator.hpp), NCCL (later), the mesh (src/parallel).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/core/dtype.hpp"

namespace lockstep::comm {

enum class ReduceOp : uint8_t { kSum, kMax, kMin };


// Bytes this rank sent, by operation kind (see the header comment for the model).
struct CommStats {
  uint64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, all_to_all = 0, broadcast = 0,
           send = 0;
  uint64_t total() const { return all_reduce + reduce_scatter + all_gather + all_to_all + broadcast + send; }
  CommStats& operator+=(const CommStats& o) {
    all_reduce += o.all_reduce, reduce_scatter += o.reduce_scatter, all_gather += o.all_gather;
    all_to_all += o.all_to_all, broadcast += o.broadcast, send += o.send;
    return *this;
  }
};

// Seconds this thread has spent in Handle::wait() since it started: the time its collectives kept
// it waiting for peers (src/train's step records it, verify/detect/stragglers.hpp compares ranks).
double thread_wait_seconds();
void add_thread_wait(double seconds);

// A started operation. wait() returns once the operation is complete and its buffers may be
// reused; it aborts the job (see above) if that takes longer than the communicator's timeout.
// Waiting on a completed or empty handle returns at once. A handle that is destroyed without
// wait() waits in its destructor (buffers must not be freed under a running operation).
class Handle {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;
  };
  Handle() = default;
  explicit Handle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      wait();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Handle() { wait(); }

  void wait() {
    if (impl_) {
      impl_->wait();
      impl_.reset();
    }
  }

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name in messages ("world", "dp", ...).
  virtual const std::string& name() const = 0;
  // World rank of each member, in group-rank order (for messages and tests).
  virtual const std::vector<int>& world_ranks() const = 0;
  virtual double timeout_s() const = 0;
  // Whether a thread may run operations on this group while other threads run operations on
  // other groups (MPI_THREAD_MULTIPLE): the gradient buckets of src/parallel/data_parallel.hpp
  // reduce on a thread of their own, beside the backward pass's tensor-parallel collectives.
  virtual bool concurrent_threads() const = 0;

  // Collective over this group: members with the same colour form a new group, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Non-blocking operations. Counts are in elements. Buffers must stay valid until wait().
  // all_reduce: recv[i] = op over ranks of send[i], i < count (send == recv allowed).
  virtual Handle iall_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op) = 0;
  // reduce_scatter: rank r receives recv_counts[r] elements: the op over ranks of the r-th block
  // of send (blocks laid out back to back in rank order).
  virtual Handle ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts,
                                 DType t, ReduceOp op) = 0;
  // all_gatherv: recv is the concatenation, in rank order, of every rank's send (counts[r] elements
  // from rank r, placed at displs[r]).
  virtual Handle iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                              std::span<const int64_t> displs, DType t) = 0;
  // all_to_allv: rank r sends send_counts[q] elements from send + send_displs[q] to rank q, and
  // receives recv_counts[q] elements from rank q at recv + recv_displs[q].
  virtual Handle iall_to_allv(const void* send, std::span<const int64_t> send_counts,
                              std::span<const int64_t> send_displs, void* recv,
                              std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                              DType t) = 0;
  virtual Handle ibroadcast(void* buf, int64_t count, DType t, int root) = 0;
  virtual Handle isend(const void* buf, int64_t count, DType t, int dest, int tag) = 0;
  virtual Handle irecv(void* buf, int64_t count, DType t, int source, int tag) = 0;
  virtual Handle ibarrier() = 0;

  // Equal-block forms of the above.
  Handle iall_gather(const void* send, void* recv, int64_t count_per_rank, DType t);
  Handle iall_to_all(const void* send, void* recv, int64_t count_per_rank, DType t);

  // Blocking forms: start and wait.
  void all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op) {
    iall_reduce(send, recv, count, t, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts, DType t,
                      ReduceOp op) {
    ireduce_scatter(send, recv, recv_counts, t, op).wait();
  }
  void all_gather(const void* send, void* recv, int64_t count_per_rank, DType t) {
    iall_gather(send, recv, count_per_rank, t).wait();
  }
  void all_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                   std::span<const int64_t> displs, DType t) {
    iall_gatherv(send, recv, counts, displs, t).wait();
  }
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType t) {
    iall_to_all(send, recv, count_per_rank, t).wait();
  }
  void all_to_allv(const void* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                   void* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                   DType t) {
    iall_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t).wait();
  }
  void broadcast(void* buf, int64_t count, DType t, int root) { ibroadcast(buf, count, t, root).wait(); }
  void send(const void* buf, int64_t count, DType t, int dest, int tag) {
    isend(buf, count, t, dest, tag).wait();
  }
  void recv(void* buf, int64_t count, DType t, int source, int tag) {
    irecv(buf, count, t, source, tag).wait();
  }
  void barrier() { ibarrier().wait(); }

  // Typed conveniences.
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    all_reduce(data.data(), data.data(), static_cast<int64_t>(data.size()), dtype_of<T>(), op);
  }
  template <class T>
  std::vector<T> all_gather(const T& value) {
    std::vector<T> out(static_cast<size_t>(size()));
    all_gather(&value, out.data(), 1, dtype_of<T>());
    return out;
  }

  const CommStats& stats() const { return stats_; }
  // Moves the bytes counted on `other` — a duplicate of this group that works for it on another
  // thread — into this group's stats, so that per-step figures cover both. Neither group may be
  // in use by another thread meanwhile.
  void absorb_stats(Communicator& other) {
    stats_ += other.stats_;
    other.stats_ = {};
  }

  // Every rank's `count` elements to `root` only, in rank order (recv_counts: each rank's count,
  // read on root; recv is read only there too), so that no other rank holds them all.
  void gatherv(const void* send, int64_t count, void* recv, std::span<const int64_t> recv_counts, DType t, int root);

  // Text: every rank's string, in rank order, on every rank (or on root only, the others getting
  // none); root's string on every rank.
  std::vector<std::string> all_gather_text(const std::string& mine);
  std::vector<std::string> gather_text(const std::string& mine, int root);
  std::string broadcast_text(const std::string& text, int root);

  // "dp group (world ranks 0,1)".
  std::string describe() const;

 protected:
  CommStats stats_;
};

// A group of one: every collective is a copy (send/recv to self are refused). Used where a mesh
// axis has size 1 and by single-process runs that never start MPI.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name = "self", int world_rank = 0)
      : name_(std::move(name)), world_ranks_{world_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  double timeout_s() const override { return 0; }
  bool concurrent_threads() const override { return true; }  // no shared state between groups
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  Handle iall_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  Handle ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts, DType t,
                         ReduceOp op) override;
  Handle iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                      std::span<const int64_t> displs, DType t) override;
  Handle iall_to_allv(const void* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                      void* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                      DType t) override;
  Handle ibroadcast(void* buf, int64_t count, DType t, int root) override;
  Handle isend(const void* buf, int64_t count, DType t, int dest, int tag) override;
  Handle irecv(void* buf, int64_t count, DType t, int source, int tag) override;
  Handle ibarrier() override { return Handle(); }

 private:
  std::string name_;
  std::vector<int> world_ranks_;
};

}  // namespace lockstep::comm
