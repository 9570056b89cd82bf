// Tensor and sequence parallelism as a plan applied to the single-device layers (torchtitan's
// pattern): each rank's layers get their share of the dims that split — heads, MLP hidden
// features, vocabulary rows — and the ops of modules.hpp that combine the ranks (Megatron-LM's):
//   column-parallel linear (weight split along its output features: qkv, mlp/fc, the head)
//     forward the local product; backward the weight gradient of the local rows, and the input
//     gradient summed over the ranks (under sequence parallelism reduce-scattered to the stream's
//     tokens: the conjugate of the norm's all-gather)
//   row-parallel linear (split along its input features: attn/proj, mlp/proj)
//     forward the local partial products summed over the ranks (reduce-scattered under sequence
//     parallelism), then the replicated bias once; backward on the stream gradient (all-gathered
//     under sequence parallelism)
//   vocabulary-parallel embedding and cross-entropy
//     each rank looks up the rows it holds (-0.0f for the others, so the sum over ranks is exact);
//     the softmax's row max, denominator and target logit combined over the ranks
//   sequence-parallel norm (sp): the stream holds a contiguous 1/tp of the micro-batch's tokens
//     (block r of the flattened (B, T) index); a norm normalises those and all-gathers its output
// Where a reduction is split across ranks — the row-parallel outputs, the column-parallel input
// gradients, the softmax denominator — each rank computes the unsplit op's canonical chunk partials
// for its slice and the group combines them exactly (TpGroup::all_reduce_exact), so canonical mode
// gives the bits of one device (the splits fall on 64-element chunks: tensor_parallel.hpp's
// check_tp_layout). Replicated tensors (norms, row-parallel biases, wpe) get identical gradients on
// every rank; under sequence parallelism the norms' gradients cover this rank's tokens and the
// caller sums them over the group (sum_norm_grads) before the gradient reduction.
// Not here: the checks a layout must pass, the Communicator collectives (tensor_parallel.hpp).
#pragma once

#include <memory>
#include <vector>

#include "src/model/modules.hpp"
#include "src/parallel/tp_group.hpp"

namespace lockstep::parallel {

class TensorParallelPlan final : public ModelPlan {
 public:
  // group must outlive the plan; sequence_parallel: split the stream's tokens over the group.
  TensorParallelPlan(TpGroup& group, bool sequence_parallel);
  ~TensorParallelPlan() override;

  LayerDims local_dims(const LayerDesc& layer) const override;
  std::vector<ParamTensor> param_layout(const ModelDesc& desc) const override;
  int64_t stream_tokens(int64_t BT) const override;
  int64_t stream_first(int64_t BT) const override;
  std::unique_ptr<NormOp> norm(const LayerDesc& layer) const override;
  std::unique_ptr<LinearOp> linear(const LayerDesc& layer, const ParamTensor& weight, LinearRows rows) const override;
  void gather_stream(const float* stream, float* all, int64_t BT, int64_t C) const override;
  std::unique_ptr<EmbeddingOp> embedding(const LayerDesc& layer) const override;
  std::unique_ptr<LossOp> loss(const LayerDesc& layer) const override;
  void max_over_shards(float* x, int64_t n) const override { group_.all_reduce_max(x, n); }

  // Buffers the ops of one rank share (exact partial sums, gathered and scattered tensors).
  struct Scratch;

 private:
  TpGroup& group_;
  bool sp_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace lockstep::parallel
