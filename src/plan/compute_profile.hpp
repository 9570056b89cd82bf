// The measured compute of one rank, for the planner on the machine it runs on (`lockstep plan
// --cluster local`, docs/planner.md): a model's passes timed with one thread — the forward and the
// backward of one micro-batch through every layer, as one tensor-parallel rank computes them (its
// shards, and the local part of its reductions: solo_tp_group.hpp), or as one context-parallel
// rank computes them (its blocks of every sequence, the attention against every position's keys,
// the local part of its gathers, ring messages and exact sums: solo_communicator.hpp), and the
// AdamW update of that rank's parameters — for each shape a layout gives a rank (tp, sequence
// parallelism, cp by all-gather or ring, micro-batch size, recomputation). `lockstep bench
// --passes` times them on every rank of the machine at once, so that each pays what the others
// cost it (shared caches and memory bandwidth), as a layout's ranks do. The planner scales these
// to a stage's layers by their FLOPs and adds what the timing leaves out: the collectives'
// transfers, the pipeline's bubble, the gradient reduction, recomputation. Its processes' resident
// memory before any model is the memory a rank needs beside the model.
//
// This is the measured efficiency of the cost model: a rank's passes, never a layout's step (the
// figure `--validate` compares the prediction with).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/config.hpp"

namespace lockstep::plan {

// Seconds of one micro-batch's passes through the whole model on one rank, and of one AdamW
// update of the rank's parameters; without recomputation also the backward split in two passes
// as the zero-bubble schedule runs it (ModelOptions::split_backward): everything but the linears'
// weight gradients, then those. The two take longer than the backward in one. state_at_rest: the
// [verify] state_at_rest detector's work in a step, which the trainer's step time includes — its
// hash of the rank's parameters and AdamW moments (all of them, as ZeRO 0 holds them) after the
// update and its hash and comparison before the next passes; 0 where the config turns it off.
struct PassTimes {
  double forward = 0, backward = 0, optimizer = 0;
  double backward_input = 0, backward_weight = 0;
  double state_at_rest = 0;
};

struct PassShape {
  int64_t tp = 1;
  bool sp = false;
  int64_t micro_batch = 1;
  Recompute recompute = Recompute::kNone;  // the backward then runs the recomputed forwards first
  int64_t cp = 1;  // the rank computes T / cp positions of each of its micro_batch sequences
  bool ring = false;  // cp's keys and values around the ring (CpComm::kP2p), not all-gathered
  auto operator<=>(const PassShape&) const = default;
};

// The shapes a local cluster of `ranks` needs for a batch of `global_batch`: tp and cp powers of two
// with tp·cp up to `ranks` that the model's layout allows (tensor_parallel.hpp,
// context_parallel.hpp), with and without sp, cp by all-gather and by the ring, micro-batches of
// 1, 2, 4, 8, 16 sequences up to the batch, and each recomputation — the planner's search.
std::vector<PassShape> profile_shapes(const RunConfig& run, int64_t ranks, int64_t global_batch);

// Times one shape on this process with one thread: `repeats` passes after three untimed, medians.
PassTimes time_passes(const RunConfig& run, const PassShape& shape, int64_t repeats);

class ComputeProfile {
 public:
  ComputeProfile() = default;
  // A `lockstep bench --passes` report; DataError naming `where` when it is not one.
  static ComputeProfile from_json(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_json() const;

  void set(const PassShape& shape, const PassTimes& t) { times_[shape] = t; }
  // What a rank holds before its model after the trainer's start-up (the binary, MPI, the GEMM
  // peak measurement, whose buffers the allocator keeps), the largest rank's: the local cluster's
  // reserved memory.
  double runtime_bytes = 0;
  // That GEMM peak on one thread (the highest figure of the ranks, as the trainer agrees on it),
  // of fp32 and of bf16 operands: the local cluster's peaks.
  double peak_fp32_flops = 0, peak_bf16_flops = 0;
  // Whether the run's bf16 linears read a bf16 copy of their weights (Backend::rounds_bf16_as_read:
  // not where the products the trainer chose round the master weights as they pack them), on any
  // rank.
  bool bf16_weight_copy = true;
  // LogicError where the shape was not measured.
  const PassTimes& at(const PassShape& shape) const;
  const std::map<PassShape, PassTimes>& times() const { return times_; }

 private:
  std::map<PassShape, PassTimes> times_;
};

}  // namespace lockstep::plan
