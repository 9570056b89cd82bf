// The device mesh: how the world's ranks are arranged along the parallel axes, and one
// sub-communicator per axis.
//
// Axes and rank order: tp varies fastest, then cp, ep, pp, and dp slowest:
//   world rank = ((((dp_i · pp + pp_i) · ep + ep_i) · cp + cp_i) · tp + tp_i)
// so that the ranks of one tensor-parallel group are neighbours (on a node, in Megatron's order),
// and a data-parallel group strides over everything else. The sub-communicator of axis a holds
// the ranks that differ only in their coordinate along a, ordered by it.
//
// The data ranks — those that train on different parts of the batch — are dp × ep (expert
// parallelism splits the experts, not the batch: expert_parallel.hpp); data() is their group,
// ordered by data_rank() = dp coordinate · ep + ep coordinate. The cp ranks of a data rank share
// its sequences, each with its positions (context_parallel.hpp); the gradients are reduced over
// dp × cp, replicas() — ordered by dp coordinate · cp + cp coordinate.
// Not here: what runs on each axis (data_parallel.hpp, tensor_parallel.hpp, expert_parallel.hpp,
// context_parallel.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "src/comm/communicator.hpp"

namespace lockstep::parallel {

enum class Axis : uint8_t { kTp, kCp, kEp, kPp, kDp };  // fastest first
inline constexpr int kAxes = 5;
const char* axis_name(Axis a);

struct MeshShape {
  int64_t dp = 0;  // 0: whatever the world size leaves (world / (tp·cp·ep·pp))
  int64_t tp = 1, pp = 1, ep = 1, cp = 1;
};

class Mesh {
 public:
  // Checks the shape against the world (sizes >= 1, product == world size);
  // ConfigError naming `source`, the sizes and the world size otherwise. Collective over world.
  Mesh(MeshShape shape, comm::Communicator& world, const std::string& source);

  int64_t size(Axis a) const { return sizes_[static_cast<size_t>(a)]; }
  int64_t coord(Axis a) const { return coords_[static_cast<size_t>(a)]; }
  comm::Communicator& group(Axis a) { return *groups_[static_cast<size_t>(a)]; }
  comm::Communicator& world() { return world_; }
  comm::Communicator& dp() { return group(Axis::kDp); }
  // The data ranks' group (dp's without expert parallelism).
  comm::Communicator& data() { return data_ ? *data_ : dp(); }
  int64_t data_rank() const { return coord(Axis::kDp) * size(Axis::kEp) + coord(Axis::kEp); }
  // The ranks that hold the same parameters and reduce their gradients: dp × cp (dp's without
  // context parallelism).
  comm::Communicator& replicas() { return replicas_ ? *replicas_ : dp(); }
  // "dp 2 x tp 1 x cp 1 x ep 1 x pp 1 (world 2)".
  std::string describe() const;

 private:
  comm::Communicator& world_;
  std::array<int64_t, kAxes> sizes_{}, coords_{};
  std::array<std::unique_ptr<comm::Communicator>, kAxes> groups_;
  std::unique_ptr<comm::Communicator> data_;      // with ep > 1
  std::unique_ptr<comm::Communicator> replicas_;  // with cp > 1
};

}  // namespace lockstep::parallel
