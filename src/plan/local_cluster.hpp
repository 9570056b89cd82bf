// `lockstep plan --cluster local`: this machine as a cluster, from measurements only — a "GPU" is
// one process of one thread (the trainer's rank with [train] threads = 1), as many as the
// collective benchmark ran; its peaks the GEMM peak the trainer measures at start-up on one
// thread (as `lockstep bench --passes` measured it); its links the measured all-reduce (collective_bench.hpp) and the ring model fitted to
// it, communication beside the compute only where the ranks leave cores free; its memory the
// machine's divided among the ranks, of which a rank's resident memory before its model (the
// binary, MPI, the GEMM peak measurement's kept buffers) is reserved, as a GPU's CUDA context is.
// Reliability and storage are not measured here (0: the planner leaves goodput out).
#pragma once

#include "src/plan/cluster.hpp"
#include "src/plan/collective_bench.hpp"
#include "src/plan/compute_profile.hpp"

namespace lockstep::plan {

// passes: the profile's GEMM peaks and a rank's memory before its model; memory_bytes: the
// machine's physical memory; cores: its online cores (a rank with one of its own has none to
// spare for communication).
Cluster local_cluster(const CollectiveBench& collectives, const ComputeProfile& passes, double memory_bytes,
                      int64_t cores);

// The links of a local cluster from a collective benchmark over its ranks: the measured samples
// and the ring model fitted to them, within and between nodes alike, and the ranks' skew.
void set_measured_links(Cluster& c, const CollectiveBench& collectives);

// Physical memory and online cores of this machine (sysconf).
double machine_memory_bytes();
int64_t online_cores();

}  // namespace lockstep::plan
