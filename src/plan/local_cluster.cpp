#include "src/plan/local_cluster.hpp"

#include <unistd.h>

#include <algorithm>

namespace lockstep::plan {

Cluster local_cluster(const CollectiveBench& collectives, const ComputeProfile& passes, double memory_bytes,
                      int64_t cores) {
  Cluster c;
  c.name = "local";
  c.source = "this machine (measured)";
  c.gpus_per_node = collectives.ranks;
  c.nodes = 1;
  c.hbm_bytes = memory_bytes / static_cast<double>(collectives.ranks);
  c.reserved_bytes = passes.runtime_bytes;
  c.peak_fp32 = passes.peak_fp32_flops;
  c.peak_bf16 = passes.peak_bf16_flops;
  c.peak_fp8 = 0;  // fp8 products are emulated on the CPU
  c.gemm_efficiency = 1;  // the measured passes (compute_profile.hpp) carry the efficiency
  set_measured_links(c, collectives);
  c.comm_beside_compute = collectives.ranks < cores;
  c.keeps_packed_operands = true;
  c.low_precision_in_fp32 = true;
  c.bf16_weight_copy = passes.bf16_weight_copy;
  return c;
}

void set_measured_links(Cluster& c, const CollectiveBench& collectives) {
  c.intra = collectives.fit;
  c.inter = collectives.fit;
  c.measured = {.fp32 = collectives.all_reduce,
                .exact = collectives.exact_all_reduce,
                .exact_scatter = collectives.exact_reduce_scatter,
                .exact_scatter_owned = collectives.exact_reduce_scatter_owned,
                .gather = collectives.all_gather,
                .layer_gather = collectives.layer_gather,
                .exact_fp32_scatter = collectives.exact_fp32_reduce_scatter,
                .exact_fp32_scatter_owned = collectives.exact_fp32_reduce_scatter_owned,
                .ranks = collectives.ranks};
  c.sync_skew = collectives.skew.share;
}

int64_t online_cores() { return std::max<int64_t>(1, sysconf(_SC_NPROCESSORS_ONLN)); }

double machine_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace lockstep::plan
