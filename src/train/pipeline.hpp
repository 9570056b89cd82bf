// Pipeline parallelism on one rank: which layers each stage holds, and a step's (or an
// evaluation's) passes of this rank's stages, its row of the schedule (src/parallel/
// pipeline_schedule.hpp), with the activations sent to the next stage and the gradients to the
// previous one over the pipeline group. With the interleaved schedule a rank holds `virtual_stages`
// stages as model chunks: stage s = chunk · pp + rank, so that a micro-batch goes round the ranks
// once per chunk (Megatron-LM's interleaving). With the zero-bubble schedule a backward is two
// passes, Bi then W (ModelOptions::split_backward), and a micro-batch is in flight until its W.
//
// Canonical bits: a stage is a contiguous range of the layer list, its model accumulates the
// canonical gradient exactly across micro-batches in any order (src/model/model.hpp), and the
// gradient norm and the loss sum every stage's exact partials, so a pipelined run ends on the
// single-process model. The stage boundaries move no bit either.
// Not here: the tables (src/parallel/pipeline_schedule.hpp), the model's stage support
// (src/model/model.hpp), the set-up (trainer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/model.hpp"
#include "src/parallel/pipeline_schedule.hpp"
#include "src/train/config.hpp"

namespace lockstep {

struct StageLayers {
  size_t first = 0, end = 0;  // layers [first, end) of the list
};

// The layers of each of `stages` stages (pp × virtual_stages): `by_hand` ("n0,n1,...", the number
// of layers of each stage in list order — [parallel] stage_layers), or else the contiguous ranges
// that make the largest stage's FLOPs per token (layer_flops_per_token) the smallest, ties going to
// the earliest cuts. The embedding is on the first stage, the head and loss on the last.
// ConfigError naming `where`: more stages than layers, a list that does not add up to the model's
// layers or leaves a stage empty.
std::vector<StageLayers> plan_stages(const ModelDesc& desc, int64_t stages, const std::string& by_hand,
                                     const std::string& where);

// "embedding..layer/1/attn" style: the first and last layer of a stage, for messages.
std::string stage_text(const ModelDesc& desc, const StageLayers& s);

// This rank's part of the pipeline: its stages as model chunks, each with the micro-batches it
// holds at once (the schedule's peak of that chunk on this rank), and its row of the step's
// schedule; every stage of the pipeline; without pipeline parallelism the whole list as one chunk
// of one slot and no passes.
struct Pipeline {
  std::vector<LayerChunk> chunks;
  std::vector<StageLayers> stages;
  std::vector<parallel::Pass> passes;
  bool split_backward = false;  // the schedule splits the backward (zb): ModelOptions::split_backward
  double unit_bubble = 0;   // the schedule's bubble on unit pass costs
  std::string description;  // the start-up line ("" without pipeline parallelism)
};

// For pp rank `rank` of `pp`, with `micro_batches` micro-batches a step on each rank. ConfigError
// naming the config for what the trainer's pipeline does not run: the zero-bubble schedule where
// zero_bubble_problem says, and with pp > 1 buddy replay.
Pipeline plan_pipeline(const RunConfig& cfg, int64_t rank, int64_t pp, int64_t micro_batches);

// Why the zero-bubble schedule does not run with these settings, as the end of a sentence ("with
// recompute ..."); empty where it runs.
std::string zero_bubble_problem(Recompute recompute, Precision precision);

// One rank's part of a step: micro-batch i reads (micro · T) tokens from inputs and targets at
// i · micro · T; its tokens are first_token + that in the global batch.
struct StageBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  int64_t micro = 0;        // sequences in a micro-batch
  int64_t count = 0;        // micro-batches
  int64_t first_token = 0;  // of the rank's batch, in the step's global batch
};

// Runs `passes` (this rank's row of the step's schedule) on `model`, this rank's stages as its
// chunks. A forward of a stage after the first receives its input from the previous stage's rank
// (rank − 1, or the last rank for the first rank's later chunks) first; a backward of a stage
// before the last receives its output's gradient from the next stage's. What a pass sends on is
// copied and sent without waiting (all sends are waited for before returning), so that no rank
// blocks in a send while its neighbour blocks in another. The last stage's loss layer adds to
// loss_sum; with tied embeddings its head gradient of wte goes to the first stage (above).
// Collective over pp.
// Returns the seconds the passes computed (forward and backward calls) and the seconds they took
// in all: the rest is the bubble — waiting for a neighbour — and the messages' copies.
struct StageTimes {
  double compute_s = 0, total_s = 0;
};
StageTimes run_stage_passes(Model& model, comm::Communicator& pp, const std::vector<parallel::Pass>& passes,
                            const StageBatch& batch, float dloss, ChunkCombiner& loss_sum);

// Tied embeddings (the head's weight is wte): the last stage computes with a copy of wte
// (Model::tied_copy). sync_tied_copy sends the first stage's wte into it (before a step's or an
// evaluation's forwards: after an update, a resume or a rollback alike); run_stage_passes sends the
// last stage's head gradient of wte to the first stage — exact sums in canonical mode — which adds
// it before its last micro-batch reports wte ready, so that wte's gradient is the single process's
// sum, rounded once. No-ops for an untied model or pp = 1. Collective over pp.
void sync_tied_copy(Model& model, comm::Communicator& pp);

// "pipeline: measured bubble by pipeline rank ...": each pipeline rank's share of its passes' time
// spent waiting for a neighbour (compute_s of stage_s, summed over the world's ranks at that
// pipeline rank: mesh order, tp fastest, then pp) — its stage's, or with interleaving its stages'
// together — beside the schedule's unit_bubble, and each pipeline rank's largest peak resident
// memory. Collective over `world`.
std::string measured_bubble(comm::Communicator& world, int64_t pp, int64_t tp, double unit_bubble, double compute_s,
                            double stage_s);

// A forward for evaluation of one micro-batch through every stage, chunk by chunk (a stage after
// the first receives its input, one before the last sends its output); the last stage's loss layer
// adds to loss_sum. Collective over pp.
void eval_through_stages(Model& model, comm::Communicator& pp, const MicroBatch& batch, ChunkCombiner& loss_sum);

}  // namespace lockstep
