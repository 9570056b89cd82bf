// Expert parallelism as a MoE layer sees it: the peers that hold the other experts, and the
// exchanges of rows between them. No transport here: src/parallel/expert_parallel.hpp carries
// them over a Communicator.
#pragma once

#include <cstdint>

namespace lockstep {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  // recv[q·n, (q+1)·n) = what peer q sent in its send[rank()·n, (rank()+1)·n): n counts per peer.
  virtual void all_to_all(const int64_t* send, int64_t* recv, int64_t n) = 0;
  // Rows of `width` values: send holds send_rows[q] rows for each peer q, back to back in peer
  // order; recv gets recv_rows[q] rows from each, likewise (recv_rows: what the peers send here).
  virtual void all_to_all_rows(const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                               int64_t width) = 0;
  virtual void all_to_all_rows(const int64_t* send, const int64_t* send_rows, int64_t* recv,
                               const int64_t* recv_rows, int64_t width) = 0;
};

}  // namespace lockstep
