// Pipeline schedules as data: for each pipeline rank, the ordered list of passes it runs in one
// step — forward, backward, or the backward split into its input-gradient and weight-gradient
// halves — over the micro-batches and the rank's model chunks (virtual stages). Pure functions of
// (schedule, pp, micro-batches, chunks) make the tables; the trainer runs them, `lockstep
// schedule` prints them, and simulate() times them with given pass costs (the bubble, the peak of
// micro-batches in flight) for the tests, the tool and a planner.
//
// Stages: with `chunks` virtual stages a rank holds model chunks c = 0..chunks-1, stage
// c·pp + rank of pp·chunks (Megatron's interleaved assignment); without, stage = rank.
//
// The schedules (p = pp, m = micro-batches, v = chunks; F, B the forward and backward of one
// micro-batch on one stage, B = Bi + W):
//   gpipe        every forward, then every backward, each in micro-batch order (GPipe). Peak in
//                flight m on every rank.
//   1f1b         rank r runs min(p − r − 1, m) forwards, then alternates one forward and one
//                backward, then the remaining backwards (PipeDream-Flush, Megatron's default).
//                Peak min(p − r, m). Bubble (p − 1)/(m + p − 1) of the step, as GPipe's.
//   interleaved  1F1B over v chunks a rank (Megatron's interleaved schedule): forwards run p
//                micro-batches of chunk 0, p of chunk 1, ..., backwards the chunks in reverse; rank r
//                warms up with (p − r − 1)·2 + (v − 1)·p forwards. Needs m a multiple of p, v ≥ 2.
//                Bubble (p − 1)/(v·m + p − 1).
//   zb           ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): the backward split
//                into Bi and W; a W waits while a Bi or a forward can run, filling the 1F1B
//                bubbles, with no more micro-batches between forward and Bi than 1F1B has in
//                flight (p − r), and at most 2p − r − 1 whose W has not run (a waiting W keeps only
//                its weight gradient's inputs); made by a greedy list scheduler on unit costs
//                (F = Bi = W), a pure function too. Bubble
//                (p − 1)/(3m + p − 1) on unit costs when m ≥ p: a third of 1F1B's idle time.
// Not here: running the passes (the trainer), the P2P messages (the Communicator).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::parallel {

enum class ScheduleKind : uint8_t { kGpipe, kOneFOneB, kInterleaved, kZeroBubble };
const char* schedule_name(ScheduleKind k);
// "gpipe" | "1f1b" | "interleaved" | "zb"; ConfigError naming `where` otherwise.
ScheduleKind parse_schedule_kind(const std::string& text, const std::string& where);

enum class PassKind : uint8_t {
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // the input gradient (what the previous stage waits for)
  kBackwardWeight,  // the weight gradient of a micro-batch whose kBackwardInput ran
};
const char* pass_letter(PassKind k);  // "F", "B", "Bi", "W"

struct Pass {
  PassKind kind;
  int64_t micro;  // 0-based micro-batch of the step
  int chunk;      // the rank's model chunk (0 without virtual stages)
};

struct PipelineSchedule {
  ScheduleKind kind;
  int64_t pp = 1, micro = 1, chunks = 1;
  std::vector<std::vector<Pass>> ranks;  // per pipeline rank, in the order it runs them

  int64_t stages() const { return pp * chunks; }
  int64_t stage(int64_t rank, int chunk) const { return chunk * pp + rank; }
  int64_t rank_of(int64_t stage) const { return stage % pp; }
  int chunk_of(int64_t stage) const { return static_cast<int>(stage / pp); }
};

// The table of `kind` for pp ranks, `micro` micro-batches and `chunks` chunks a rank. ConfigError
// naming `where` when the numbers do not fit: pp, micro, chunks >= 1; chunks > 1 only (and >= 2
// always) for interleaved, whose micro-batches must be a multiple of pp.
PipelineSchedule make_schedule(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks, const std::string& where);
// make_schedule's checks alone, without making the table (which runs to pp × 3·micro passes).
void check_schedule_shape(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks, const std::string& where);

// Time of one pass on one stage, in any unit; a full backward costs Bi + W.
struct PassCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;
  double p2p = 0;  // from a pass's end to the start of the pass on another rank that needs it
};

struct TimedPass {
  int64_t rank;
  Pass pass;
  double start, end;
};

struct Timeline {
  std::vector<TimedPass> passes;  // in the order they were placed
  double makespan = 0;
  double bubble = 0;  // idle share of pp × makespan
  std::vector<int64_t> peak_in_flight;  // per rank: (chunk, micro-batch)s between forward and B or Bi at once
  // Per rank: the sum of its chunks' own peaks (chunk_peaks) — the activation sets a rank allocates
  // when each chunk keeps its own; peak_in_flight without interleaving nor a split backward.
  std::vector<int64_t> chunk_slots;
};

// The most micro-batches of each chunk whose activations one rank holds at once in its row of a
// table with `chunks` chunks a rank: from a forward to its B, or where the backward is split to its
// W, since the weight gradients read the layers' inputs.
std::vector<int64_t> chunk_peaks(const std::vector<Pass>& row, int64_t chunks);

// Where in a rank's row (of `chunks` chunks) the gradients are final: the index of each chunk's
// last input-gradient pass (B or Bi) and of its last weight-gradient pass (B or W); the rank's
// last of each is the latest over its chunks.
struct FinalPasses {
  std::vector<size_t> input, weight;  // by chunk
  size_t last_input() const { return *std::max_element(input.begin(), input.end()); }
  size_t last_weight() const { return *std::max_element(weight.begin(), weight.end()); }
};
FinalPasses final_passes(const std::vector<Pass>& row, int64_t chunks);

// A model whose embedding (first stage) and head (last stage) share wte: the first rank's last
// input-gradient pass waits for the head's gradient of wte, which the last rank sends after its
// last weight-gradient pass and which takes `send` to arrive (pipeline.hpp's trainer does so).
struct TiedEmbedding {
  bool tied = false;
  double send = 0;
};

// Runs the table: each rank's passes in its order, each starting when the rank's previous pass
// has ended and its inputs are there (a forward: the previous stage's forward of its micro-batch;
// a backward or Bi: its own forward and the next stage's backward or Bi; a W: its Bi; and with a
// tied embedding, TiedEmbedding's wait). A micro-batch is in flight from its forward to its B or Bi.
// InternalError when the table cannot complete (a pass waits for one that never comes): a table
// that would hang the pipeline.
Timeline simulate(const PipelineSchedule& s, const PassCosts& costs);
// The same with each pipeline rank's own costs (by_rank[r]; a send costs the receiver's p2p).
Timeline simulate(const PipelineSchedule& s, const std::vector<PassCosts>& by_rank, TiedEmbedding tied = {});

// The bubble the literature gives for `kind` with F = Bi = W and no p2p time (1f1b, gpipe:
// (p − 1)/(m + p − 1); interleaved: (p − 1)/(v·m + p − 1); zb: (p − 1)/(3m + p − 1) for m ≥ p,
// -1 below, where no micro-batches are left to fill the bubble with).
double bubble_formula(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks);

}  // namespace lockstep::parallel
