// Tensor parallelism (Megatron style) over a mesh's tp group: the checks a layout must pass, the
// plan's TpGroup over a Communicator, and the gather/scatter between a rank's shards and the
// global tensors (checkpoints, model hash).
//
// The split itself (which rows or columns of each tensor a rank holds) is src/model/param_layout.hpp;
// the ops that combine the ranks' parts are tp_plan.hpp.
//
// Collectives of CommTpGroup, and their cost in bytes sent per rank (p = tp, n elements):
//   all_reduce_exact  exact_reduce_scatter of the exact sums (8 bytes per element, plus records for
//                     the rare spilled element) + fp32 all-gather: 12·n·(p−1)/p, against 8·n·(p−1)/p
//                     for a float ring all-reduce, which would not be reproducible;
//   all_reduce_sum    fp32 reduce-scatter + all-gather (8·n·(p−1)/p): every rank gets the same bits,
//                     which a float all-reduce does not promise;
//   all_reduce_max    MPI all-reduce with max (exact in any order).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops/mode.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/config.hpp"
#include "src/model/model.hpp"
#include "src/model/param_layout.hpp"
#include "src/parallel/tp_group.hpp"

namespace lockstep::parallel {

// ConfigError naming `source`, the field and the reason if the model cannot be split over tp
// ranks: heads, kv heads, ffn width and vocabulary must divide by tp; in canonical mode every split
// reduction must fall on 64-element chunks (d_model/tp, kv width/tp, ffn/tp, vocab/tp multiples
// of 64). Sequence parallelism (sp) needs tp > 1 and a rank's micro-batch of micro_tokens tokens
// to divide by tp (in canonical mode into multiples of 64 tokens).
void check_tp_layout(const ModelConfig& model, int64_t tp, bool sp, int64_t micro_tokens, Mode mode,
                     const std::string& source);

// The least a rank must send per step for tensor parallelism without sequence parallelism, with
// fp32 ring all-reduces (8·n·(p−1)/p bytes for n elements), for `tokens` tokens on the rank:
// forward, the embedding output and the two row-parallel outputs of each layer; backward, the
// input gradients of QKV and MLP-in of each layer and of the head: (4L + 2) all-reduces of
// tokens·d_model values; the cross-entropy's row max, softmax denominator and target logit: 3 of
// `tokens` values. 0 for tp = 1. Sequence parallelism moves the same volume (each all-reduce
// becomes an all-gather and a reduce-scatter, 4·n·(p−1)/p bytes each) and adds the sum of the norm
// weights' gradients over tp once per step (8·(p−1)/p bytes per norm parameter).
uint64_t tp_min_bytes(const ModelConfig& model, int64_t tp, bool sp, int64_t tokens);

// Sequence parallelism: each tp rank's gradients of the norm weights and biases cover its own
// tokens; after the last micro-batch, this adds the other ranks' to each rank's, so that every rank
// holds the gradient over all tokens — canonical: the exact sums (doubles, and the
// SuperAccumulators of spilled elements) added exactly, still unrounded; fast: an fp32 sum with the
// same bits on every rank. Collective over tp.
void sum_norm_grads(Model& model, comm::Communicator& tp);
// Elements [first, end) of gradient storage.
struct ElementRange {
  int64_t first = 0, end = 0;
};
// The same over `group` for the elements in `ranges` (the same on every rank) of gradient storage:
// grads.f32[i] (fast) or grads.exact's element i (canonical); grads.offset is ignored. Expert
// parallelism sums the replicated tensors' gradients over ep with it.
void sum_over_group(GradSink grads, std::span<const ElementRange> ranges, comm::Communicator& group);

class CommTpGroup final : public TpGroup {
 public:
  explicit CommTpGroup(comm::Communicator& comm) : comm_(comm) {}
  int64_t size() const override { return comm_.size(); }
  int64_t rank() const override { return comm_.rank(); }
  void all_reduce_exact(const ExactAccumulator& acc, float* x) override;
  void all_reduce_sum(float* x, int64_t n) override;
  void all_reduce_max(float* x, int64_t n) override;
  void all_gather(const float* local, float* full, int64_t n) override;
  void reduce_scatter_exact(const ExactAccumulator& acc, float* local) override;
  void reduce_scatter_sum(const float* full, float* local, int64_t n) override;

 private:
  comm::Communicator& comm_;
  std::vector<float> shard_;
};

// The global flat buffer (the tp = 1 layout of `model`) from every tp rank's local buffer laid out
// as `local` (this rank's layout). Collective over tp; every rank gets the whole buffer. `local`
// may be a pipeline stage's run of the tensors: the buffer is then those tensors whole, packed;
// or (expert parallelism) ep rank ep.rank's tensors: then those, whole.
std::vector<float> gather_global(const ModelConfig& model, const std::vector<ParamTensor>& local,
                                 const float* local_data, comm::Communicator& tp, EpCoord ep = {});

// This rank's local buffer (layout `local`) taken from a global flat buffer (the tp = 1 layout;
// for a stage's run of the tensors, those tensors whole, packed).
void take_local(const ModelConfig& model, const std::vector<ParamTensor>& local, const float* global_data,
                float* local_data);

// For a checkpoint's state: each tensor's global shape, split dim and every tp rank's ranges along
// it (where it lies in the global tensor), in canonical order.
nlohmann::json describe_shards(const ModelConfig& model, int64_t tp);

}  // namespace lockstep::parallel
