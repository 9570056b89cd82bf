// The planner's cost model (docs/planner.md; Planner::predict in planner.hpp computes it, with
// the collectives' times below): one step of a layout on a cluster, predicted from
// the model's layer list, the trainer's own stage assignment and pipeline tables, and α–β models
// of the collectives.
//
// Time of the busiest pipeline rank (its stage's layers, src/train/pipeline.hpp's plan_stages):
//   compute    FLOPs of its layers (layer list: 2 per weight per token forward, 4 backward, the
//              attention's scores and values; a tied head's product counted on the head's stage)
//              at the cluster's GEMM rate for the precision, over tp; recomputation re-runs the
//              recomputed sub-layers' forwards before their backward;
//   tp comm    per micro-batch, one all-reduce of the residual stream's micro-batch (mb·T·C
//              activations) per attention and MLP sub-layer forward and backward, one more for the
//              embedding's output (forward) and the head's input gradient (backward) — sequence
//              parallelism moves the same bytes as an all-gather and a reduce-scatter; not hidden;
//   pipeline   the schedule's table (pipeline_schedule.hpp) timed by simulate() with these passes
//              (F, B = Bi + W halved) and a p2p send of a micro-batch's activations: its makespan
//              over the busy time is the bubble and the sends on the critical path;
//   dp         the gradient reduction as the trainer does it (data_parallel.hpp): zero 0 and 1 a
//              reduce-scatter and an all-gather of the fp32 gradient (zero 1 then an all-gather of
//              the parameters), zero 2 a reduce-scatter in every micro-batch and the parameters'
//              all-gather; buckets reduced during the backward, so what is exposed is the part
//              longer than the backward it overlaps, and at least the last bucket's.
// Collectives: rings over the group's link (NVLink when the group lies within a node, the
//   GPU's share of the inter-node network otherwise): all-reduce 2(n−1)·α + 2(n−1)/n·S/β,
//   reduce-scatter and all-gather half of it; a p2p send α + S/β.
// Memory of the GPU that holds the most: parameters (fp32, and a bf16 copy of the matrices in
//   bf16 and fp8, two fp8 copies of them in fp8), fp32 gradients, AdamW's m and v (zero 1: over
//   dp; zero 2: gradients too, plus the staging of one bucket), the activations each micro-batch
//   keeps per layer (the trainer's: norm outputs, QKV, the attention probabilities, MLP hidden,
//   logits; 2 bytes in bf16/fp8, 4 in fp32; sequence parallelism splits them over tp; recomputed
//   sub-layers keep their input and one layer's worth is rebuilt at a time) times the micro-batches
//   the schedule keeps in flight on that rank, and the cluster's reserved HBM.
// Not modelled: non-GEMM kernels (norms, softmax, the optimizer's pass over the parameters), the
//   data loader, overlap of tp collectives with compute, network contention between groups.
#pragma once

#include <cstdint>
#include <string>

#include "src/model/layer_list.hpp"
#include "src/plan/cluster.hpp"
#include "src/plan/layout.hpp"

namespace lockstep::plan {

inline constexpr double kGiB = 1 << 30;

struct PlanRequest {
  ModelDesc model;  // its seq_len the step's
  int64_t global_batch = 0;  // sequences per step
  Precision precision = Precision::kBf16;
  std::string source;  // the model's config file, for messages
};

struct StepTime {
  double compute = 0;    // GEMMs of the busiest rank, recomputation included
  double recompute = 0;  // of which forwards run again
  double tp_comm = 0;
  double pipeline = 0;   // the makespan beyond the busiest rank's passes: bubble and p2p
  double dp_exposed = 0;
  double total = 0;
};

struct Memory {
  double params = 0, grads = 0, optimizer = 0, activations = 0, reserved = 0;
  double total() const { return params + grads + optimizer + activations + reserved; }
};

struct Prediction {
  Layout layout;
  StepTime time;
  Memory memory;  // of the GPU that holds the most
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs per second over the GPUs' peak in the precision
  int64_t micro_batches = 0;  // per step, per pipeline
};

// α–β ring collectives of `bytes` (the whole buffer) over n ranks, and a point-to-point send.
double all_reduce_time(double bytes, int64_t n, const Link& l);
double reduce_scatter_time(double bytes, int64_t n, const Link& l);
double all_gather_time(double bytes, int64_t n, const Link& l);
double send_time(double bytes, const Link& l);

// The link of a group of n ranks `stride` apart in the mesh's rank order (tp fastest, then pp,
// then dp): NVLink if the group fits in a node.
const Link& group_link(const Cluster& c, int64_t stride, int64_t n);

}  // namespace lockstep::plan
