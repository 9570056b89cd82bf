#include "verify/detect/agreed.hpp"

namespace lockstep::detect {

std::vector<uint64_t> agreed_all_gather(comm::Communicator& comm, std::span<const uint64_t> mine) {
  const size_t n = mine.size(), p = static_cast<size_t>(comm.size());
  std::vector<uint64_t> send(3 * n), recv(3 * n * p), out(n * p);
  for (size_t copy = 0; copy < 3; ++copy) std::copy(mine.begin(), mine.end(), send.begin() + copy * n);
  comm.all_gather(send.data(), recv.data(), static_cast<int64_t>(3 * n), DType::kU64);
  for (size_t r = 0; r < p; ++r) {
    const uint64_t* c = recv.data() + 3 * n * r;
    for (size_t i = 0; i < n; ++i) out[n * r + i] = majority(c[i], c[n + i], c[2 * n + i]);
  }
  return out;
}

}  // namespace lockstep::detect
