// Mesh validation, coordinates and per-axis sub-communicators (see mesh.hpp).
#include "src/parallel/mesh.hpp"

#include "src/core/check.hpp"

namespace lockstep::parallel {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::kTp: return "tp";
    case Axis::kCp: return "cp";
    case Axis::kEp: return "ep";
    case Axis::kPp: return "pp";
    case Axis::kDp: return "dp";
  }
  throw InternalError("axis_name: unknown Axis");
}

Mesh::Mesh(MeshShape shape, comm::Communicator& world, const std::string& source) : world_(world) {
  const int64_t world_size = world.size();
  for (auto [name, v] : {std::pair{"tp", shape.tp}, {"pp", shape.pp}, {"ep", shape.ep}, {"cp", shape.cp}}) {
    LS_REQUIRE(v >= 1, source, ": [parallel] ", name, " (", v, ") must be >= 1");
  }
  const int64_t others = shape.tp * shape.cp * shape.ep * shape.pp;
  LS_REQUIRE(shape.dp >= 0, source, ": [parallel] dp (", shape.dp, ") must be >= 1 (or 0: all ranks)");
  LS_REQUIRE(shape.dp > 0 || world_size % others == 0, source, ": [parallel] tp (", shape.tp, ") x pp (", shape.pp,
             ") x ep (", shape.ep, ") x cp (", shape.cp, ") = ", others, " must divide the number of ranks (", world_size,
             "): dp takes what they leave");
  const int64_t dp = shape.dp == 0 ? world_size / others : shape.dp;
  LS_REQUIRE(dp * others == world_size, source, ": [parallel] dp (", dp, ") x tp (", shape.tp, ") x pp (",
             shape.pp, ") x ep (", shape.ep, ") x cp (", shape.cp, ") = ", dp * others,
             " must equal the number of ranks (", world_size, ")");
  sizes_ = {shape.tp, shape.cp, shape.ep, shape.pp, dp};

  // Coordinates: tp fastest, dp slowest.
  int64_t rest = world.rank();
  for (int a = 0; a < kAxes; ++a) {
    coords_[static_cast<size_t>(a)] = rest % sizes_[static_cast<size_t>(a)];
    rest /= sizes_[static_cast<size_t>(a)];
  }
  // Axis a's group: same coordinates on every other axis (colour = rank with coord a zeroed).
  int64_t stride = 1;
  for (int a = 0; a < kAxes; ++a) {
    const int64_t color = world.rank() - coords_[static_cast<size_t>(a)] * stride;
    groups_[static_cast<size_t>(a)] =
        world.split(static_cast<int>(color), static_cast<int>(coords_[static_cast<size_t>(a)]),
                    axis_name(static_cast<Axis>(a)));
    stride *= sizes_[static_cast<size_t>(a)];
  }
  if (size(Axis::kEp) > 1) {
    // Same tp, cp and pp coordinates; ordered by dp, then ep.
    const int64_t tp_cp = size(Axis::kTp) * size(Axis::kCp);
    const int64_t color = world.rank() % tp_cp + tp_cp * coord(Axis::kPp);
    data_ = world.split(static_cast<int>(color), static_cast<int>(data_rank()), "data");
  }
  if (size(Axis::kCp) > 1) {
    // Same tp, ep and pp coordinates; ordered by dp, then cp.
    const int64_t tp = size(Axis::kTp), cp = size(Axis::kCp);
    const int64_t color = coord(Axis::kTp) + tp * (coord(Axis::kEp) + size(Axis::kEp) * coord(Axis::kPp));
    replicas_ = world.split(static_cast<int>(color), static_cast<int>(coord(Axis::kDp) * cp + coord(Axis::kCp)), "dp_cp");
  }
}

std::string Mesh::describe() const {
  return str_cat("dp ", size(Axis::kDp), " x tp ", size(Axis::kTp), " x cp ", size(Axis::kCp), " x ep ",
                 size(Axis::kEp), " x pp ", size(Axis::kPp), " (world ", world_.size(), ")");
}

}  // namespace lockstep::parallel
