// One rank's training run as set up from its config: what the loop and its observers share.
// Not here: the set-up itself and the loop (trainer.cpp).
#pragma once

#include <cstdint>
#include <ostream>
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
  comm::Communicator& dp;  // the data-parallel group
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

  bool tensor_parallel() const { return tp.size() > 1; }
  bool pipelined() const { return pp != nullptr && pp->size() > 1; }
  // This rank's flat buffer (its layout) as whole tensors in global_layout: gathered over tp, and
  // the stages' over pp. Collective over tp and pp.
  std::vector<float> gather(const float* local) const;
};

}  // namespace lockstep
