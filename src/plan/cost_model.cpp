#include "src/plan/cost_model.hpp"

namespace lockstep::plan {

double all_reduce_time(double bytes, int64_t n, const Link& l) {
  if (n <= 1) return 0;
  const double k = static_cast<double>(n - 1);
  return 2 * k * l.latency + 2 * k / static_cast<double>(n) * bytes / l.bandwidth;
}

double reduce_scatter_time(double bytes, int64_t n, const Link& l) { return all_reduce_time(bytes, n, l) / 2; }

double all_gather_time(double bytes, int64_t n, const Link& l) { return all_reduce_time(bytes, n, l) / 2; }

double send_time(double bytes, const Link& l) { return l.latency + bytes / l.bandwidth; }

const Link& group_link(const Cluster& c, int64_t stride, int64_t n) {
  return stride * (n - 1) + 1 <= c.gpus_per_node && c.gpus_per_node % (stride * n) == 0 ? c.intra : c.inter;
}

}  // namespace lockstep::plan
