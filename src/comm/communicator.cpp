// The backend-independent parts of Communicator: equal-block forms, messages, the self group.
#include "src/comm/communicator.hpp"

#include <cstring>
#include <sstream>

#include "src/core/check.hpp"

namespace lockstep::comm {

namespace {
thread_local double t_waited = 0;
}  // namespace

double thread_wait_seconds() { return t_waited; }
void add_thread_wait(double seconds) { t_waited += seconds; }

Handle Communicator::iall_gather(const void* send, void* recv, int64_t count_per_rank, DType t) {
  const auto p = static_cast<size_t>(size());
  std::vector<int64_t> counts(p, count_per_rank), displs(p);
  for (size_t r = 0; r < p; ++r) displs[r] = static_cast<int64_t>(r) * count_per_rank;
  return iall_gatherv(send, recv, counts, displs, t);
}

Handle Communicator::iall_to_all(const void* send, void* recv, int64_t count_per_rank, DType t) {
  const auto p = static_cast<size_t>(size());
  std::vector<int64_t> counts(p, count_per_rank), displs(p);
  for (size_t r = 0; r < p; ++r) displs[r] = static_cast<int64_t>(r) * count_per_rank;
  return iall_to_allv(send, counts, displs, recv, counts, displs, t);
}

std::vector<std::string> Communicator::all_gather_text(const std::string& mine) {
  const std::vector<int64_t> counts = all_gather(static_cast<int64_t>(mine.size()));
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::string all(static_cast<size_t>(displs.back() + counts.back()), '\0');
  all_gatherv(mine.data(), all.data(), counts, displs, DType::kU8);
  std::vector<std::string> out;
  for (size_t r = 0; r < counts.size(); ++r) {
    out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(counts[r])));
  }
  return out;
}

void Communicator::gatherv(const void* send, int64_t count, void* recv, std::span<const int64_t> recv_counts, DType t,
                           int root) {
  const auto n = static_cast<size_t>(size());
  std::vector<int64_t> send_counts(n, 0), send_displs(n, 0), counts(n, 0), displs(n, 0);
  send_counts[static_cast<size_t>(root)] = count;
  if (rank() == root) {
    for (size_t r = 0; r < n; ++r) {
      counts[r] = recv_counts[r];
      if (r > 0) displs[r] = displs[r - 1] + counts[r - 1];
    }
  }
  all_to_allv(send, send_counts, send_displs, recv, counts, displs, t);
}

std::vector<std::string> Communicator::gather_text(const std::string& mine, int root) {
  const std::vector<int64_t> counts = all_gather(static_cast<int64_t>(mine.size()));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::string all(rank() == root ? static_cast<size_t>(total) : 0, '\0');
  gatherv(mine.data(), static_cast<int64_t>(mine.size()), all.data(), counts, DType::kU8, root);
  std::vector<std::string> out;
  if (rank() != root) return out;
  size_t at = 0;
  for (int64_t c : counts) {
    out.push_back(all.substr(at, static_cast<size_t>(c)));
    at += static_cast<size_t>(c);
  }
  return out;
}

std::string Communicator::broadcast_text(const std::string& text, int root) {
  auto bytes = static_cast<int64_t>(text.size());
  broadcast(&bytes, 1, DType::kI64, root);
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(bytes), '\0');
  broadcast(out.data(), bytes, DType::kU8, root);
  return out;
}

std::string Communicator::describe() const {
  std::ostringstream os;
  os << name() << " group (world ranks ";
  for (size_t i = 0; i < world_ranks().size(); ++i) os << (i ? "," : "") << world_ranks()[i];
  os << ")";
  return os.str();
}

std::unique_ptr<Communicator> SelfCommunicator::split(int, int, const std::string& name) {
  return std::make_unique<SelfCommunicator>(name, world_ranks_[0]);
}

Handle SelfCommunicator::iall_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp) {
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(t));
  return Handle();
}

Handle SelfCommunicator::ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts,
                                         DType t, ReduceOp) {
  LS_CHECK(recv_counts.size() == 1);
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(recv_counts[0]) * dtype_size(t));
  return Handle();
}

Handle SelfCommunicator::iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                                      std::span<const int64_t> displs, DType t) {
  LS_CHECK(counts.size() == 1 && displs.size() == 1);
  const size_t es = dtype_size(t);
  std::memmove(static_cast<char*>(recv) + static_cast<size_t>(displs[0]) * es, send,
               static_cast<size_t>(counts[0]) * es);
  return Handle();
}

Handle SelfCommunicator::iall_to_allv(const void* send, std::span<const int64_t> send_counts,
                                      std::span<const int64_t> send_displs, void* recv,
                                      std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                                      DType t) {
  LS_CHECK(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0]);
  const size_t es = dtype_size(t);
  std::memmove(static_cast<char*>(recv) + static_cast<size_t>(recv_displs[0]) * es,
               static_cast<const char*>(send) + static_cast<size_t>(send_displs[0]) * es,
               static_cast<size_t>(send_counts[0]) * es);
  return Handle();
}

Handle SelfCommunicator::ibroadcast(void*, int64_t, DType, int root) {
  LS_CHECK(root == 0, "root ", root);
  return Handle();
}

Handle SelfCommunicator::isend(const void*, int64_t, DType, int dest, int) {
  throw InternalError(str_cat("send to rank ", dest, " on a group of one (", name_, ")"));
}

Handle SelfCommunicator::irecv(void*, int64_t, DType, int source, int) {
  throw InternalError(str_cat("recv from rank ", source, " on a group of one (", name_, ")"));
}

}  // namespace lockstep::comm
