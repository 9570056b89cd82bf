// One rank's training run as set up from its config: what the loop and its observers share.
// Not here: the set-up itself and the loop (trainer.cpp).
#pragma once

#include <cstdint>
#include <ostream>
#include <functional>
#include <span>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/data/sampler.hpp"
#include "src/model/model.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/pipeline_schedule.hpp"
#include "src/train/config.hpp"

namespace lockstep {

struct TrainRun {
  const RunConfig& cfg;
  comm::Communicator& world;
  comm::Communicator& dp;  // the data-parallel group (dp × cp: the ranks that reduce gradients)
  comm::Communicator& tp;  // the tensor-parallel group (a group of one without tp)
  Model& model;
  parallel::DataParallel& ddp;
  data::TrainSampler& sampler;
  std::ostream& out;       // world rank 0's console; the others write nothing
  int64_t T = 0;           // tokens per sequence
  int64_t B = 0, MB = 0;   // global batch and micro-batch, in sequences
  int64_t BL = 0, MBL = 0; // this rank's share of them
  // Whole tensors (the tp = 1 layout): checkpoints, dumps and the model hash hold these.
  std::vector<ParamTensor> global_layout;
  // Pipeline parallelism: the group of the stages (nullptr or a group of one without), and this
  // rank's row of the step's schedule (src/train/pipeline.hpp).
  comm::Communicator* pp = nullptr;
  std::vector<parallel::Pass> passes;
  // Every stage's parameters (whole tensors), in stage order: stage s is chunk s / pp of pipeline
  // rank s % pp.
  std::vector<int64_t> stage_params;
  // Expert parallelism: the ep group (nullptr or a group of one without); the data ranks are dp x
  // ep, this one's part of the batch is data_rank's.
  comm::Communicator* ep = nullptr;
  int64_t data_rank = 0;
  // Context parallelism: the cp group (nullptr or a group of one without); each rank holds
  // T / cp positions of every sequence (src/parallel/context_parallel.hpp).
  comm::Communicator* cp = nullptr;

  bool tensor_parallel() const { return tp.size() > 1; }
  bool pipelined() const { return pp != nullptr && pp->size() > 1; }
  bool expert_parallel() const { return ep != nullptr && ep->size() > 1; }
  bool context_parallel() const { return cp != nullptr && cp->size() > 1; }
  // Tokens of each sequence on this rank: T, or T / cp.
  int64_t local_T() const { return context_parallel() ? T / cp->size() : T; }
  // Whether this rank is in the first data-parallel replica (dp rank 0: its cp ranks, which hold
  // its sequences' other positions, too).
  bool first_replica() const { return dp.rank() / (context_parallel() ? cp->size() : 1) == 0; }
  // This rank's flat buffer (its layout) as whole tensors in global_layout: its dp shard (`local`
  // then holds ddp's shard only: a ZeRO-2 gradient, ZeRO-3 parameters) gathered over dp first, then
  // over tp, the experts over ep, and the stages' over pp, put in stage order. Collective over tp,
  // ep and pp (and dp).
  std::vector<float> gather(const float* local, bool dp_sharded = false) const;
  // The parameters this rank holds: the model's whole buffer, or under ZeRO-3 its shard (of the
  // flat buffer, from ddp.shard_first()).
  std::span<float> held_params() const;
  // After writing held_params() outside an update (a rollback, a resume): what was gathered from
  // them is stale.
  void held_params_written();
  // The whole parameters (model.params()) for a moment under ZeRO-3: gathered from the shards,
  // and this rank's part written back when `use` returns (collective over dp). Elsewhere `use`
  // just runs.
  void with_whole_params(const std::function<void()>& use);
};

}  // namespace lockstep
