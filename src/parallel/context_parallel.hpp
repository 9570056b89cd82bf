// Context parallelism over a mesh's cp group: every sequence's T positions cut into 2·cp blocks of
// T / (2·cp), rank r holding blocks r and 2·cp − 1 − r (zig-zag: under the causal mask, block i's
// queries meet i + 1 blocks of keys, so every rank gets the same share of the attention work). The
// cp ranks of one data rank train on the same sequences, each on its positions' tokens: the
// embedding, norms, linears, MLP and loss run on those tokens as they are (the linears' weight
// gradients are token reductions whose chunks of 64 lie in one block); the attention is the one op
// that crosses positions, and a MoE layer's routing, whose capacity and balancing loss span each
// sequence, reads every position's router logits (gather_positions).
//
// Attention: each rank all-gathers every rank's k and v (its q stays), computes its query blocks
// against the keys before them (kernels/ops/attention.hpp's _rows variants: each row bit for bit
// the one-process row), and in the backward adds its pairs' dk and dv to one exact sum per element
// (canonical), which the cp group reduces exactly and rounds once — the chunks of a key's chain
// lie inside one query block, so the sum of the blocks' exact partials is the one process's sum —
// or in fp32 (fast mode). The backward gathers k and v again instead of keeping every position's
// per layer and micro-batch: attention memory per rank is (B, NH, T/cp, T) probabilities per layer
// plus one set of whole-sequence buffers ((B, T, width) q, k and v, the gradients of k and v and
// their exact sums) that every layer's op uses in turn.
//
// The ring ([parallel] cp_comm = "p2p"): instead of the all-gather, every rank's k and v travel
// around the cp ranks, rank r sending on to r + 1 the block it received from r − 1 while it
// computes its queries against it, and the attention runs blockwise (kernels/ops/attention.hpp,
// "Blockwise"): per query row the online softmax's statistics — max, Z, and the output's sums —
// pass over the key blocks, nothing (T, T)-shaped exists, and the layer keeps the rows' max and Z
// (2·NH floats a token) instead of their probabilities. Canonical mode needs three passes forward
// (max; Z; the weighted values, with the exact Z) and two backward (D; the gradients), the first of
// each overlapping the ring's messages, the others over the blocks received; every sum over keys
// is exact, so the bits are the all-gather's, which are the one process's. The keys' gradients
// are laid out by owner (rank, block) and reduce-scattered straight to their owners. Cost per layer
// and micro-batch: the same k and v bytes as the all-gather, forward and backward, and
// 4·B·T·KV·(cp−1)/cp bytes of key gradients (exact sums: 9 bytes an element); the scores are
// computed three times forward and twice backward (fast mode: twice and twice).
//
// Gradients: the cp ranks hold the same parameters and each a part of every gradient, so the
// data-parallel reduction (and ZeRO's shards) runs over dp × cp, as Megatron-LM's does; the loss
// sums over it too. Canonical bits: every gradient is an exact sum rounded once, so the model hash
// is the one-process hash for every cp.
//
// Cost per attention layer and micro-batch, B sequences, KV = 2·NKV·HS floats a position (this
// rank's heads): forward, an all-gather of k and v (4·B·T·KV·(cp−1)/cp bytes received); backward,
// that again and the reduction of dk and dv over all T positions: canonical, an exact
// reduce-scatter and an fp32 all-gather (12·B·T·KV·(cp−1)/cp bytes sent), fast, an fp32
// all-reduce. The data-parallel reduction's bytes are dp × cp's.
//
// Not here: the kernels (kernels/cpu/attention.cpp, attention_blocks.cpp), the dp × cp group (mesh.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/model/config.hpp"
#include "src/model/modules.hpp"
#include "src/model/precision.hpp"

namespace lockstep::parallel {

// How the cp ranks exchange keys and values ([parallel] cp_comm): "all_gather", the probabilities
// kept (attn/att), or "p2p", the ring with the blockwise attention (its dumps hold every tensor but
// attn/att; op-local bounds then take the reference's own probabilities).
enum class CpComm : uint8_t { kAllGather, kP2p };
// ConfigError naming `source` and the field for a name other than "all_gather" and "p2p".
CpComm parse_cp_comm(const std::string& name, const std::string& source);
// The name parse_cp_comm reads: "all_gather" or "p2p"; of the ring where `ring`.
const char* cp_comm_name(bool ring);

// What else a run with context parallelism uses.
struct CpRun {
  PrecisionRecipe precision;
  int64_t pp = 1;
  bool buddy = false, sp_dump = false, reference = false;
};
// ConfigError naming `source` and the field where cp cannot run: seq_len must be a multiple of
// 2·cp·64 (whole chunks of 64 positions in every block); not yet with fp8 linears, pipeline
// parallelism, buddy replays, dumps under sequence parallelism or the reference check.
void check_cp_layout(const ModelConfig& model, int64_t cp, const CpRun& run, const std::string& source);

// Rank `rank`'s blocks of [0, T) under cp ranks: {r·c, c} and {(2·cp − 1 − r)·c, c}, c = T / (2·cp).
std::vector<SeqBlock> zigzag_blocks(int64_t T, int64_t cp, int64_t rank);
// zigzag_blocks of every rank, in rank order.
std::vector<std::vector<SeqBlock>> every_rank_blocks(int64_t T, int64_t cp);

// `inner` (one device, or a tensor-parallel plan) on this cp rank's positions.
// The whole-sequence buffers of the attention ops, which run one at a time (context_parallel.cpp).
struct CpBuffers;

class ContextParallelPlan final : public ForwardingPlan {
 public:
  // Both must outlive the plan.
  ContextParallelPlan(const ModelPlan& inner, comm::Communicator& cp, CpComm comm);
  ~ContextParallelPlan() override;

  std::vector<SeqBlock> sequence(int64_t T) const override { return zigzag_blocks(T, cp_.size(), cp_.rank()); }
  // Every layer's op shares the plan's buffers.
  std::unique_ptr<AttentionOp> attention(const LayerDesc& layer) const override;
  // An all-gather over cp, each rank's blocks put in place.
  void gather_positions(const float* local, float* whole, int64_t B, int64_t T, int64_t width) const override;

 private:
  comm::Communicator& cp_;
  CpComm comm_;
  std::unique_ptr<CpBuffers> buffers_;
};

// The least a rank must send per step for context parallelism, for `sequences` sequences and
// `attention_layers` attention layers on it (tp ranks splitting the heads): per layer, its k and v
// to the other cp ranks in the forward and again in the backward, and the keys' gradients reduced
// as an fp32 ring reduce-scatter would — 3 · 4·sequences·T·KV·(cp−1)/cp bytes, KV = 2·NKV·HS / tp.
// 0 for cp = 1.
uint64_t cp_min_bytes(const ModelConfig& model, int64_t cp, int64_t tp, int64_t sequences, int64_t attention_layers);

}  // namespace lockstep::parallel
