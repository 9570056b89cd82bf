// MPI backend: non-blocking MPI collectives behind Handles whose wait() is watched by a timeout.
#include "src/comm/mpi_communicator.hpp"

// The C API only: mpi.h would otherwise pull in Open MPI's deprecated C++ bindings (MPI::),
// which live in a library the component does not link (MPI::MPI_C).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <numeric>
#include <thread>

#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"

// Every MPI call: on failure, one line naming the rank, the call, what it was for, MPI's reason.
#define LS_MPI_CHECK(call, what)                                                                  \
  do {                                                                                            \
    const int ls_mpi_rc_ = (call);                                                                \
    if (ls_mpi_rc_ != MPI_SUCCESS) ::lockstep::comm::mpi_failed(#call, ls_mpi_rc_, (what));       \
  } while (0)

namespace lockstep::comm {

namespace {

// This process's rank in the job, for messages (0 outside a launch).
int world_rank() { return std::max(0, MpiRuntime::job_rank()); }

}  // namespace

void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "rank %d: %s\n", world_rank(), message.c_str());
  std::fflush(stderr);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

[[noreturn]] void mpi_failed(const char* call, int rc, const std::string& what) {
  char reason[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, reason, &len);
  abort_job(str_cat(call, " failed (", what, "): ", reason), kExitMpiError);
}

namespace {

// The MPI type that moves elements of t. The narrow float formats travel as their bit patterns
// (MPI has no arithmetic for them: reduce_type refuses them).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kU8: case DType::kE4M3: case DType::kE5M2: case DType::kE8M0: return MPI_UINT8_T;
    case DType::kU16: case DType::kBF16: case DType::kF16: return MPI_UINT16_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU64: return MPI_UINT64_T;
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
  }
  throw InternalError("mpi_type: unknown DType");
}

// The MPI type of a reduction over t: only the formats MPI computes in.
MPI_Datatype reduce_type(DType t) {
  LS_CHECK(t == DType::kI32 || t == DType::kI64 || t == DType::kU64 || t == DType::kF32 || t == DType::kF64 ||
               t == DType::kU8,
           "MPI cannot reduce ", dtype_name(t), " elements");
  return mpi_type(t);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  throw InternalError("mpi_op: unknown ReduceOp");
}

// MPI-3 counts are int; Lockstep's buffers are indexed with int64.
int to_int(int64_t n, const char* what) {
  LS_CHECK(n >= 0 && n <= INT_MAX, what, " ", n, " does not fit an MPI count");
  return static_cast<int>(n);
}

std::vector<int> to_ints(std::span<const int64_t> v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_int(v[i], what);
  return out;
}

// How a rank waits for its operations: the watchdog's limit (0: none), and whether its node runs
// more ranks than it has cores.
struct Waiting {
  double timeout_s = 0;
  bool oversubscribed = false;

  // Between two polls of an unfinished operation that started `waited` seconds ago. Spin while it
  // is likely close to done. Then, on a core of its own, yield: that costs nothing when nobody
  // else wants the core and hands it at once to whoever does (the step's thread beside the
  // gradient reduction's). On an oversubscribed node, or once a peer is far behind, sleep: a
  // yielding rank still takes turns from the ranks with work. Sleeps are coarse: 50 us asked
  // measured about 250 us on a virtual machine, so a rank with its own core sleeps only late.
  void pause(double waited) const {
    using std::chrono::microseconds;
    if (oversubscribed) {
      if (waited > 5e-6) std::this_thread::sleep_for(microseconds(waited < 50e-3 ? 50 : 500));
    } else if (waited > 20e-3) {
      std::this_thread::sleep_for(microseconds(200));
    } else if (waited > 50e-6) {
      std::this_thread::yield();
    }
  }
};

// A started MPI operation; owns what MPI reads until completion (count arrays, a description).
class MpiRequest final : public Handle::Impl {
 public:
  MpiRequest(std::string what, Waiting waiting) : what_(std::move(what)), waiting_(waiting) {}

  // MPI reads count/displacement arrays of non-blocking v-collectives until completion.
  std::vector<int>& keep(std::vector<int> v) {
    kept_.push_back(std::move(v));
    return kept_.back();
  }
  MPI_Request* request() { return &request_; }

  void wait() override {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (;;) {
      int done = 0;
      LS_MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), what_);
      if (done) {
        add_thread_wait(std::chrono::duration<double>(Clock::now() - start).count());
        return;
      }
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (waiting_.timeout_s > 0 && waited > waiting_.timeout_s) {
        abort_job(str_cat(what_, " did not complete in ", waiting_.timeout_s,
                          " s; a peer may have died or hung ([parallel] timeout_s)"),
                  kExitWatchdog);
      }
      waiting_.pause(waited);
    }
  }

 private:
  std::string what_;
  Waiting waiting_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::deque<std::vector<int>> kept_;  // a deque: references from keep() stay valid
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, Waiting waiting)
      : comm_(comm), name_(std::move(name)), waiting_(waiting) {
    LS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "setting the error handler of " + name_);
    LS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), name_);
    LS_MPI_CHECK(MPI_Comm_size(comm_, &size_), name_);
    int me = world_rank();
    world_ranks_.resize(static_cast<size_t>(size_));
    // Blocking on purpose: construction is collective, and messages need the member list.
    LS_MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, world_ranks_.data(), 1, MPI_INT, comm_),
                 "listing the members of " + name_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  double timeout_s() const override { return waiting_.timeout_s; }
  bool concurrent_threads() const override {
    int provided = MPI_THREAD_SINGLE;
    LS_MPI_CHECK(MPI_Query_thread(&provided), "querying MPI's thread level");
    return provided == MPI_THREAD_MULTIPLE;
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    LS_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub), "splitting " + describe() + " into " + name);
    return std::make_unique<MpiCommunicator>(sub, name, waiting_);
  }

  Handle iall_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override {
    auto req = start("all_reduce");
    const void* s = send == recv ? MPI_IN_PLACE : send;
    LS_MPI_CHECK(MPI_Iallreduce(s, recv, to_int(count, "count"), reduce_type(t), mpi_op(op), comm_, req->request()),
                 what("all_reduce"));
    stats_.all_reduce += ring_bytes(count, t) * 2;
    return Handle(std::move(req));
  }

  Handle ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts, DType t,
                         ReduceOp op) override {
    LS_CHECK(static_cast<int>(recv_counts.size()) == size_);
    auto req = start("reduce_scatter");
    const std::vector<int>& counts = req->keep(to_ints(recv_counts, "recv_counts"));
    LS_MPI_CHECK(MPI_Ireduce_scatter(send, recv, counts.data(), reduce_type(t), mpi_op(op), comm_, req->request()),
                 what("reduce_scatter"));
    stats_.reduce_scatter += others_bytes(recv_counts, t);
    return Handle(std::move(req));
  }

  Handle iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                      std::span<const int64_t> displs, DType t) override {
    LS_CHECK(static_cast<int>(counts.size()) == size_ && counts.size() == displs.size());
    auto req = start("all_gather");
    const std::vector<int>& c = req->keep(to_ints(counts, "counts"));
    const std::vector<int>& d = req->keep(to_ints(displs, "displs"));
    LS_MPI_CHECK(MPI_Iallgatherv(send, c[static_cast<size_t>(rank_)], mpi_type(t), recv, c.data(), d.data(),
                                 mpi_type(t), comm_, req->request()),
                 what("all_gather"));
    stats_.all_gather += others_bytes(counts, t);
    return Handle(std::move(req));
  }

  Handle iall_to_allv(const void* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_displs,
                      void* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                      DType t) override {
    LS_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_);
    auto req = start("all_to_all");
    const std::vector<int>& sc = req->keep(to_ints(send_counts, "send_counts"));
    const std::vector<int>& sd = req->keep(to_ints(send_displs, "send_displs"));
    const std::vector<int>& rc = req->keep(to_ints(recv_counts, "recv_counts"));
    const std::vector<int>& rd = req->keep(to_ints(recv_displs, "recv_displs"));
    LS_MPI_CHECK(MPI_Ialltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(), mpi_type(t),
                                comm_, req->request()),
                 what("all_to_all"));
    stats_.all_to_all += others_bytes(send_counts, t);
    return Handle(std::move(req));
  }

  Handle ibroadcast(void* buf, int64_t count, DType t, int root) override {
    auto req = start("broadcast");
    LS_MPI_CHECK(MPI_Ibcast(buf, to_int(count, "count"), mpi_type(t), root, comm_, req->request()),
                 what("broadcast"));
    if (rank_ == root) stats_.broadcast += static_cast<uint64_t>(count) * dtype_size(t);
    return Handle(std::move(req));
  }

  Handle isend(const void* buf, int64_t count, DType t, int dest, int tag) override {
    auto req = std::make_unique<MpiRequest>(
        str_cat("send to rank ", dest, " (world rank ", world_ranks_.at(static_cast<size_t>(dest)), ") on ",
                describe()),
        waiting_);
    LS_MPI_CHECK(MPI_Isend(buf, to_int(count, "count"), mpi_type(t), dest, tag, comm_, req->request()),
                 what("send"));
    stats_.send += static_cast<uint64_t>(count) * dtype_size(t);
    return Handle(std::move(req));
  }

  Handle irecv(void* buf, int64_t count, DType t, int source, int tag) override {
    auto req = std::make_unique<MpiRequest>(
        str_cat("recv from rank ", source, " (world rank ", world_ranks_.at(static_cast<size_t>(source)), ") on ",
                describe()),
        waiting_);
    LS_MPI_CHECK(MPI_Irecv(buf, to_int(count, "count"), mpi_type(t), source, tag, comm_, req->request()),
                 what("recv"));
    return Handle(std::move(req));
  }

  Handle ibarrier() override {
    auto req = start("barrier");
    LS_MPI_CHECK(MPI_Ibarrier(comm_, req->request()), what("barrier"));
    return Handle(std::move(req));
  }

 private:
  std::string what(const char* op) const { return str_cat(op, " on ", describe()); }
  std::unique_ptr<MpiRequest> start(const char* op) const {
    return std::make_unique<MpiRequest>(what(op), waiting_);
  }
  // Ring algorithms send (p-1)/p of the data from each rank.
  uint64_t ring_bytes(int64_t count, DType t) const {
    return static_cast<uint64_t>(count) * dtype_size(t) * static_cast<uint64_t>(size_ - 1) /
           static_cast<uint64_t>(size_);
  }
  uint64_t others_bytes(std::span<const int64_t> counts, DType t) const {
    uint64_t n = 0;
    for (size_t q = 0; q < counts.size(); ++q) {
      if (static_cast<int>(q) != rank_) n += static_cast<uint64_t>(counts[q]);
    }
    return n * dtype_size(t);
  }

  MPI_Comm comm_;
  std::string name_;
  Waiting waiting_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  LS_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "initialising MPI");
  owns_ = true;
}

MpiRuntime::~MpiRuntime() {
  if (owns_) MPI_Finalize();
}

bool MpiRuntime::launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

int MpiRuntime::launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return -1;
}

int MpiRuntime::launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return -1;
}

std::vector<int> MpiRuntime::active_ranks() {
  const char* list = std::getenv("LOCKSTEP_ACTIVE_RANKS");
  if (list == nullptr || *list == '\0') return {};
  const int size = launcher_size();
  std::vector<int> ranks;
  for (std::string_view item : split_commas(list)) {
    int r = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), r);
    const bool known = ec == std::errc() && end == item.data() + item.size() && r >= 0 && (size < 0 || r < size);
    LS_REQUIRE(known && std::find(ranks.begin(), ranks.end(), r) == ranks.end(),
                     "LOCKSTEP_ACTIVE_RANKS=", list, ": expected distinct launcher ranks below ", size,
                     " separated by commas; '", item, "' is not one");
    ranks.push_back(r);
  }
  return ranks;
}

int MpiRuntime::job_rank() {
  const int me = launcher_rank();
  std::vector<int> active;
  try {
    active = active_ranks();
  } catch (const InputError&) {
    return me;  // world() reports the list; messages before it name the launcher's rank
  }
  if (me < 0 || active.empty()) return me;
  const auto it = std::find(active.begin(), active.end(), me);
  return it == active.end() ? -1 : static_cast<int>(it - active.begin());
}

std::unique_ptr<Communicator> MpiRuntime::world(double timeout_s) const {
  MPI_Comm comm = MPI_COMM_NULL;
  const std::vector<int> active = active_ranks();
  if (active.empty()) {
    LS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "duplicating MPI_COMM_WORLD");
  } else {
    // Collective over the listed processes only: the ones standing by never call it.
    MPI_Group all = MPI_GROUP_NULL, job = MPI_GROUP_NULL;
    LS_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &all), "the group of MPI_COMM_WORLD");
    LS_MPI_CHECK(MPI_Group_incl(all, static_cast<int>(active.size()), active.data(), &job),
                 "the group of LOCKSTEP_ACTIVE_RANKS");
    LS_MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, job, 0, &comm), "the job's communicator");
    MPI_Group_free(&job);
    MPI_Group_free(&all);
  }
  // The ranks sharing this node's memory (and cores) with this one.
  MPI_Comm node = MPI_COMM_NULL;
  LS_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "grouping the job by node");
  int node_ranks = 1;
  LS_MPI_CHECK(MPI_Comm_size(node, &node_ranks), "counting the ranks on this node");
  MPI_Comm_free(&node);
  const bool oversubscribed = static_cast<unsigned>(node_ranks) > std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<MpiCommunicator>(comm, "world", Waiting{timeout_s, oversubscribed});
}

JobWorld job_world(double timeout_s) {
  JobWorld j;
  if (MpiRuntime::launched()) {
    j.mpi = std::make_unique<MpiRuntime>();
    j.world = j.mpi->world(timeout_s);
  } else {
    j.world = std::make_unique<SelfCommunicator>("world");
  }
  return j;
}

}  // namespace lockstep::comm
