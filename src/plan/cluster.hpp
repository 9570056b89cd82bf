// A cluster for the layout planner (`lockstep plan`, docs/planner.md): what one GPU computes and
// holds, and what its links carry, read from a TOML file (scripts/clusters/). Every field is
// required: a figure the planner would guess is a figure it would get wrong silently.
//
//   [cluster]    name, gpus_per_node, nodes, hbm_gib, reserved_gib (HBM not available to the
//                run: CUDA context, allocator slack, communication buffers), hbm_gbs (the HBM's
//                bandwidth, GB/s)
//   [peak_tflops] fp32, bf16, fp8: dense peak per GPU (0: the precision is not supported)
//   [efficiency] gemm: the fraction of peak a large GEMM reaches, and memory: the fraction of
//                hbm_gbs a kernel that streams its tensors (a norm, a softmax, an elementwise op,
//                the optimizer) reaches, each as measured by a benchmark of that GPU (never fitted
//                to the step times the planner predicts)
//   [intra_node] bandwidth_gbs (per GPU, per direction, GB/s), latency_us: NVLink/NVSwitch
//   [inter_node] bandwidth_gbs (per GPU: its share of the node's NICs), latency_us
//   [reliability] mtbf_gpu_hours (mean time between failures of one GPU's share of the machine:
//                the job fails every mtbf_gpu_hours / GPUs hours), restart_s (from a failure to
//                training again: detection, rescheduling, loading the checkpoint)
//   [storage]    write_gbs: the aggregate bandwidth a checkpoint is written at, GB/s
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/model/precision.hpp"

namespace lockstep::plan {

// An all-reduce measured over a link (collective_bench.hpp).
struct CollectiveSample {
  double bytes = 0;    // the buffer's, fp32
  double seconds = 0;  // median over the repeats of the slowest rank's time
};

struct Link {
  double bandwidth = 0;  // bytes/s per GPU per direction
  double latency = 0;    // s per message step
};

// The all-reduce measured on the cluster itself (the local cluster): its times over `ranks` ranks
// by size, which the collectives of groups of that size follow instead of α–β (cost_model.hpp) —
// of fp32 sums, and canonical mode's exact one (the exact sums' doubles reduce-scattered and added
// exactly, the rounded fp32 all-gathered: parallel/exact_reduce.hpp), and that reduce-scatter
// alone into running exact sums, as ZeRO-2 reduces a bucket: split evenly, and inside one rank's
// shard (a bucket smaller than a shard); fast mode's exact reduce-scatter of fp32 values, likewise
// (`exact_fp32_scatter`: [parallel] reduce = "exact"); and the all-gather of fp32 parts (`gather`),
// and again from and into buffers out of the caches, as ZeRO-3 gathers a layer (`layer_gather`).
struct MeasuredAllReduce {
  // By increasing size.
  std::vector<CollectiveSample> fp32 = {}, exact = {}, exact_scatter = {}, exact_scatter_owned = {}, gather = {};
  std::vector<CollectiveSample> layer_gather = {};
  std::vector<CollectiveSample> exact_fp32_scatter = {}, exact_fp32_scatter_owned = {};
  int64_t ranks = 0;
};

struct Cluster {
  std::string name, source;
  int64_t gpus_per_node = 0, nodes = 0;
  double hbm_bytes = 0, reserved_bytes = 0;
  double peak_fp32 = 0, peak_bf16 = 0, peak_fp8 = 0;  // FLOP/s
  double gemm_efficiency = 0;
  // Bytes/s the kernels other than GEMMs stream their tensors at (hbm_gbs × [efficiency] memory);
  // 0 on the local cluster, whose measured passes hold every kernel.
  double stream_bandwidth = 0;
  Link intra, inter;
  double mtbf_gpu_hours = 0, restart_s = 0;
  double storage_write = 0;  // bytes/s, the whole job's
  MeasuredAllReduce measured;  // none on a declared cluster
  // The share of a rank's compute that waiting for the slowest rank at the collectives adds
  // (sync_skew.hpp): measured on the local cluster; 0 on a declared one, whose GPUs the planner
  // takes to run the same kernels in the same time.
  double sync_skew = 0;
  // Whether a collective proceeds beside the compute (a GPU's copy engines and NCCL's own SMs);
  // not where each rank has one core, which its communication thread then takes from the compute.
  bool comm_beside_compute = true;
  // Whether the GEMMs pack their operands into a scratch they keep, as large as the largest
  // product's (the local CPU cluster: matmul.isa.cpp; a GPU's cuBLAS workspace is fixed, part of
  // the reserved memory).
  bool keeps_packed_operands = false;
  // Whether the trainer here keeps bf16 and fp8 values in fp32 containers — the activations, the
  // weights' low-precision copies, the activations it sends between ranks — as the CPU backend
  // does (the local cluster); a GPU keeps a bf16 value in 2 bytes and an fp8 one in 1.
  bool low_precision_in_fp32 = false;
  // Whether a bf16 linear reads a bf16 copy of its master weight, made each step, rather than the
  // master itself rounded as its products pack it (the CPU backend's fast mode with VDPBF16PS
  // products: ComputeProfile::bf16_weight_copy).
  bool bf16_weight_copy = true;

  int64_t gpus() const { return gpus_per_node * nodes; }
  // FLOP/s a GPU's GEMMs reach in `p` (0 where it has no such unit).
  double gemm_flops(Precision p) const;
  double peak(Precision p) const;
};

// ConfigError naming the file and the field (missing, not a number, out of range).
Cluster load_cluster(const std::string& path);

}  // namespace lockstep::plan
