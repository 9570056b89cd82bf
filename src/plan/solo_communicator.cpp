#include "src/plan/solo_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "src/core/check.hpp"

namespace lockstep::plan {

namespace {

// n elements of type t from src + from to dst + to (elements), where they differ.
void copy_elements(const void* src, int64_t from, void* dst, int64_t to, int64_t n, DType t) {
  const size_t es = dtype_size(t);
  const char* s = static_cast<const char*>(src) + static_cast<size_t>(from) * es;
  char* d = static_cast<char*>(dst) + static_cast<size_t>(to) * es;
  if (s != d && n > 0) std::memmove(d, s, static_cast<size_t>(n) * es);
}

}  // namespace

SoloCommunicator::SoloCommunicator(int size, std::string name)
    : name_(std::move(name)), world_ranks_(static_cast<size_t>(size)) {
  LS_CHECK(size >= 1, "a group of ", size, " ranks");
  std::iota(world_ranks_.begin(), world_ranks_.end(), 0);
}

std::unique_ptr<comm::Communicator> SoloCommunicator::split(int, int, const std::string&) {
  throw InternalError(str_cat("split of the solo group ", name_, ": a profile's passes form no groups"));
}

comm::Handle SoloCommunicator::iall_reduce(const void* send, void* recv, int64_t count, DType t, comm::ReduceOp) {
  copy_elements(send, 0, recv, 0, count, t);
  return comm::Handle();
}

comm::Handle SoloCommunicator::ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts,
                                               DType t, comm::ReduceOp) {
  LS_CHECK(static_cast<int>(recv_counts.size()) == size());
  copy_elements(send, 0, recv, 0, recv_counts[0], t);
  return comm::Handle();
}

// Every rank's block is this one's (as much of it as the block holds).
comm::Handle SoloCommunicator::iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                                            std::span<const int64_t> displs, DType t) {
  LS_CHECK(static_cast<int>(counts.size()) == size() && displs.size() == counts.size());
  for (size_t r = 0; r < counts.size(); ++r) {
    copy_elements(send, 0, recv, displs[r], std::min(counts[0], counts[r]), t);
  }
  return comm::Handle();
}

// Every rank sends this one what this one sends itself.
comm::Handle SoloCommunicator::iall_to_allv(const void* send, std::span<const int64_t> send_counts,
                                            std::span<const int64_t> send_displs, void* recv,
                                            std::span<const int64_t> recv_counts,
                                            std::span<const int64_t> recv_displs, DType t) {
  LS_CHECK(static_cast<int>(send_counts.size()) == size() && recv_counts.size() == send_counts.size());
  for (size_t q = 0; q < recv_counts.size(); ++q) {
    copy_elements(send, send_displs[0], recv, recv_displs[q], std::min(send_counts[0], recv_counts[q]), t);
  }
  return comm::Handle();
}

comm::Handle SoloCommunicator::ibroadcast(void*, int64_t, DType, int) { return comm::Handle(); }

void SoloCommunicator::match(const Unmatched& m) {
  const auto partner = std::find_if(unmatched_.begin(), unmatched_.end(), [&](const Unmatched& u) {
    return u.tag == m.tag && (u.send != nullptr) != (m.send != nullptr);
  });
  if (partner == unmatched_.end()) {
    unmatched_.push_back(m);
    return;
  }
  const Unmatched& send = m.send != nullptr ? m : *partner;
  const Unmatched& recv = m.send != nullptr ? *partner : m;
  LS_CHECK(send.t == recv.t, "solo group ", name_, ": a message of tag ", m.tag, " sent and received as different types");
  copy_elements(send.send, 0, recv.recv, 0, std::min(send.count, recv.count), send.t);
  unmatched_.erase(partner);
}

comm::Handle SoloCommunicator::isend(const void* buf, int64_t count, DType t, int dest, int tag) {
  LS_CHECK(dest >= 0 && dest < size(), "send to rank ", dest, " of the solo group ", name_, " of ", size());
  match({.send = buf, .count = count, .t = t, .tag = tag});
  return comm::Handle();
}

comm::Handle SoloCommunicator::irecv(void* buf, int64_t count, DType t, int source, int tag) {
  LS_CHECK(source >= 0 && source < size(), "recv from rank ", source, " of the solo group ", name_, " of ", size());
  match({.recv = buf, .count = count, .t = t, .tag = tag});
  return comm::Handle();
}

}  // namespace lockstep::plan
