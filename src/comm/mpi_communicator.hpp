// The MPI backend of Communicator (Open MPI; CPU buffers), and the MPI runtime's lifetime.
//
// Every MPI call is wrapped in LS_MPI_CHECK (errors are returned, not fatal inside MPI, and turned
// into one message naming this rank, the call and the group, then MPI_Abort). Every operation is
// started non-blocking; Handle::wait() polls MPI_Testall with a short sleep between polls (so that
// a waiting rank does not steal a core from a computing one when ranks share cores) and ends the
// job with a message naming this rank, the operation, the group and its members when the
// communicator's timeout passes — the watchdog.
//
// This header does not include mpi.h: src/comm is the only component that sees it.
// Not here: NCCL; process management (mpirun/srun launch the ranks).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"

namespace lockstep::comm {

// Initialises MPI unless it already is, asking for MPI_THREAD_MULTIPLE (OpenMP threads never call
// MPI, but data parallelism reduces gradient buckets on a thread of its own while the main thread
// runs tensor-parallel collectives; Debian 12's Open MPI 4.1 provides it), and finalises it on
// destruction if it initialised it. Communicators report the level MPI provided
// (concurrent_threads()). One per process; communicators made from it must be destroyed first.
class MpiRuntime {
 public:
  MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // True if this process was started by an MPI launcher (mpirun, srun): the single-process path
  // never initialises MPI.
  static bool launched();
  // This process's rank as the launcher numbered it (mpirun, srun: the process slot, whose device
  // a fault follows), before MPI is initialised; -1 outside a launch. launcher_size(): how many.
  static int launcher_rank();
  static int launcher_size();

  // The job's processes in job-rank order (launcher ranks), from LOCKSTEP_ACTIVE_RANKS, which
  // `lockstep launch --spares` sets: the processes not listed stand by, to take the place of a slow
  // or faulty one in a restart. Empty when unset (every process is in the job, in launcher order).
  // A malformed list is an InputError naming the variable.
  static std::vector<int> active_ranks();
  // This process's rank in the job: its place in active_ranks(), or its launcher rank when that is
  // empty; -1 for a process that stands by, and outside a launch.
  static int job_rank();
  static bool standing_by() { return launched() && job_rank() < 0; }

  // The job's processes (MPI_COMM_WORLD, or its active_ranks() in their order), duplicated, with
  // errors returned, as a Communicator named "world". Not for a process that stands by.
  std::unique_ptr<Communicator> world(double timeout_s) const;

 private:
  bool owns_ = false;
};

// The job's world: MPI's under mpirun/srun (the runtime finalised when the JobWorld goes, after
// its world), otherwise a group of one, MPI never initialised.
struct JobWorld {
  std::unique_ptr<MpiRuntime> mpi;
  std::unique_ptr<Communicator> world;
};
JobWorld job_world(double timeout_s);

// Prints "rank R: message" to stderr as one line and ends every rank of the job (MPI_Abort with
// `code`). Safe to call from any thread.
[[noreturn]] void abort_job(const std::string& message, int code);

// Exit codes of abort_job.
inline constexpr int kExitWatchdog = 4;   // a collective did not complete within the timeout
inline constexpr int kExitMpiError = 5;   // an MPI call failed
inline constexpr int kExitDiverged = 6;   // replicas that must be equal are not

}  // namespace lockstep::comm
