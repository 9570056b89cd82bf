// The tensor-parallel plan's ops (see tp_plan.hpp).
#include "src/parallel/tp_plan.hpp"

#include "src/core/check.hpp"
#include "src/core/exact_sum.hpp"

namespace lockstep::parallel {

struct TensorParallelPlan::Scratch {
  ExactAccumulator sum;  // exact partial sums of a split reduction
  std::vector<float> buf, gathered, ce_max, ce_z, ce_target;

  // v's storage for at least n floats (grown once to the largest need, then reused).
  static float* floats(std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    return v.data();
  }
};

namespace {

// What every op of the plan knows: the group, sequence parallelism, the shared scratch.
struct Group {
  TpGroup& tp;
  bool sp;
  TensorParallelPlan::Scratch& scratch;

  int64_t p() const { return tp.size(); }
  int64_t stream(int64_t BT) const { return sp ? BT / tp.size() : BT; }
  // The stream gradient of all BT tokens: dres itself, or all-gathered under sequence parallelism.
  const float* gathered(const float* dres, int64_t BT, int64_t C) {
    if (!sp) return dres;
    float* full = TensorParallelPlan::Scratch::floats(scratch.gathered, BT * C);
    tp.all_gather(dres, full, stream(BT) * C);
    return full;
  }
  // A split reduction of rows × cols outputs summed over the group into out: all the rows, or
  // under sequence parallelism this rank's stream rows. Canonical mode: the ranks' exact chunk
  // partials (add_partials into an exact sum), rounded once; fast: fp32 sums of what each rank's
  // compute(dst) writes.
  template <class AddPartials, class Compute>
  void reduce(Mode mode, int64_t rows, int64_t cols, float* out, AddPartials add_partials, Compute compute) {
    const int64_t n = rows * cols;
    if (mode == Mode::kCanonical) {
      scratch.sum.reset(static_cast<size_t>(n));
      add_partials(scratch.sum);
      if (sp) {
        tp.reduce_scatter_exact(scratch.sum, out);
      } else {
        tp.all_reduce_exact(scratch.sum, out);
      }
    } else if (sp) {
      float* full = TensorParallelPlan::Scratch::floats(scratch.buf, n);
      compute(full);
      tp.reduce_scatter_sum(full, out, stream(rows) * cols);
    } else {
      compute(out);
      tp.all_reduce_sum(out, n);
    }
  }
};

class SequenceParallelNorm final : public NormOp {
 public:
  SequenceParallelNorm(const LayerDesc& layer, Group g) : layer_(layer), g_(g) {}
  void forward(Backend& be, Mode mode, int64_t BT, float* out, float* mean, float* rstd, const float* inp, const float* w,
               const float* b, bool round_bf16) override {
    const int64_t rows = g_.stream(BT), C = layer_.dims.C;
    float* local = TensorParallelPlan::Scratch::floats(g_.scratch.buf, rows * C);
    norm_forward_rows(be, layer_, mode, rows, local, mean, rstd, inp, w, b, round_bf16);
    g_.tp.all_gather(local, out, rows * C);
  }

 private:
  const LayerDesc& layer_;
  Group g_;
};

class ColumnParallelLinear final : public LinearOp {
 public:
  explicit ColumnParallelLinear(Group g) : g_(g) {}
  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w, const float* b) override {
    be.linear_forward(mode, s, out, inp, w, b);
  }
  // Weight and bias gradients are this rank's rows; dinp sums over the output features, split
  // across the group, and is written like linear_backward's `dinp =`.
  // A rounding of dinp to bf16 (LinearShape::round_outputs) comes after the sum.
  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    be.linear_backward(mode, s, token_offset, nullptr, dw, db, dout, inp, w);
    if (dinp == nullptr) return;  // a caller that wants the weight's gradients only (fp8_linear.cpp)
    const LinearShape part = unrounded(s);
    g_.reduce(
        mode, s.N, s.IC, dinp, [&](ExactAccumulator& sum) { be.linear_backward_dinp_partials(part, sum, dout, w); },
        [&](float* dst) { be.linear_backward(mode, part, token_offset, dst, {}, {}, dout, inp, w); });
    if (s.round_outputs) be.round_to_bf16(g_.stream(s.N) * s.IC, dinp, dinp);
  }

 private:
  Group g_;
};

class RowParallelLinear final : public LinearOp {
 public:
  explicit RowParallelLinear(Group g) : g_(g) {}
  // out[n,o] = Σ over the input features, split across the group; under sequence parallelism
  // this rank keeps only its stream tokens' rows (a reduce-scatter instead of an all-reduce).
  // A rounding of out to bf16 (LinearShape::round_outputs) comes after the sum and the bias.
  void forward(Backend& be, Mode mode, LinearShape s, float* out, const float* inp, const float* w, const float* b) override {
    const LinearShape part = unrounded(s);
    g_.reduce(
        mode, s.N, s.OC, out, [&](ExactAccumulator& sum) { be.linear_forward_partials(part, sum, inp, w); },
        [&](float* dst) { be.linear_forward(mode, part, dst, inp, w, nullptr); });
    const int64_t rows = g_.stream(s.N);
    // The replicated bias, once, after the rounding: linear_forward's epilogue `dot + bias[o]`.
    if (b != nullptr) {
      for (int64_t i = 0; i < rows; ++i) {
        float* row = out + i * s.OC;
        for (int64_t o = 0; o < s.OC; ++o) row[o] = row[o] + b[o];
      }
    }
    if (s.round_outputs) be.round_to_bf16(rows * s.OC, out, out);
  }
  void backward(Backend& be, Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dw, GradSink db,
                const float* dout, const float* inp, const float* w) override {
    be.linear_backward(mode, s, token_offset, dinp, dw, db, g_.gathered(dout, s.N, s.OC), inp, w);
  }

 private:
  Group g_;
};

// Vocabulary-parallel: one rank holds each token's row, the others give -0.0f: an exact sum.
class VocabParallelEmbedding final : public EmbeddingOp {
 public:
  VocabParallelEmbedding(const LayerDesc& layer, Group g) : layer_(layer), g_(g) {}
  void forward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, float* out, const int32_t* tokens,
               const float* wte, const float* wpe) override {
    const int64_t BT = B * seq_tokens(seq), C = layer_.dims.C;
    float* embedded = g_.sp ? TensorParallelPlan::Scratch::floats(g_.scratch.buf, BT * C) : out;
    embedding_forward_blocks(be, mode, shape(B), seq, embedded, tokens, wte, wpe);
    if (g_.sp) {
      g_.tp.reduce_scatter_sum(embedded, out, g_.stream(BT) * C);
    } else {
      g_.tp.all_reduce_sum(out, BT * C);
    }
  }
  // The gradients from all the tokens (the conjugate of the forward's reduce-scatter).
  void backward(Backend& be, Mode mode, int64_t B, std::span<const SeqBlock> seq, int64_t token_offset, GradSink dwte,
                GradSink dwpe, const float* dout, const int32_t* tokens) override {
    const float* full = g_.gathered(dout, B * seq_tokens(seq), layer_.dims.C);
    embedding_backward_blocks(be, mode, shape(B), seq, token_offset, dwte, dwpe, full, tokens);
  }

 private:
  EmbeddingShape shape(int64_t B) const {
    const int64_t V = layer_.dims.V, rows = V / g_.p();
    return {B, layer_.dims.T, layer_.dims.C, V, g_.tp.rank() * rows, rows};
  }
  const LayerDesc& layer_;
  Group g_;
};

// The row max, the softmax denominator and the target's logit are combined across the group
// (kernels/ops/crossentropy.hpp), then each rank finishes its columns.
class VocabParallelCrossEntropy final : public LossOp {
 public:
  VocabParallelCrossEntropy(const LayerDesc& layer, Group g) : V_(layer.dims.V), g_(g) {}
  void forward(Backend& be, Mode mode, int64_t N, float* losses, float* logits, const int32_t* targets, float dloss,
               bool backward) override {
    Scratch& sc = g_.scratch;
    const int64_t held = V_ / g_.p();
    const CrossEntropyShard s{N, held, g_.tp.rank() * held, V_};
    float* m = Scratch::floats(sc.ce_max, N);
    float* z = Scratch::floats(sc.ce_z, N);
    float* target = Scratch::floats(sc.ce_target, N);
    be.crossentropy_shard_max(s, m, logits);
    g_.tp.all_reduce_max(m, N);
    sc.sum.reset(static_cast<size_t>(N));
    be.crossentropy_shard_partition(mode, s, sc.sum, target, logits, m, targets);
    g_.tp.all_reduce_exact(sc.sum, z);
    g_.tp.all_reduce_sum(target, N);
    be.crossentropy_shard_finish(mode, s, dloss, losses, backward ? logits : nullptr, logits, m, z, target, targets);
  }

 private:
  using Scratch = TensorParallelPlan::Scratch;
  int64_t V_;
  Group g_;
};

}  // namespace

TensorParallelPlan::TensorParallelPlan(TpGroup& group, bool sequence_parallel)
    : group_(group), sp_(sequence_parallel), scratch_(std::make_unique<Scratch>()) {}

TensorParallelPlan::~TensorParallelPlan() = default;

LayerDims TensorParallelPlan::local_dims(const LayerDesc& layer) const {
  LayerDims d = layer.dims;
  const int64_t p = group_.size();
  LS_CHECK(d.NH % p == 0 && d.NKV % p == 0 && d.F % p == 0 && d.V % p == 0, layer.prefix,
           layer_kind_name(layer.kind), ": tensor-parallel split over ", p, " ranks (checked by check_tp_layout)");
  d.NH /= p;
  d.NKV /= p;
  d.F /= p;
  d.V /= p;
  return d;
}

std::vector<ParamTensor> TensorParallelPlan::param_layout(const ModelDesc& desc) const {
  return build_param_layout(desc, {group_.size(), group_.rank()});
}

int64_t TensorParallelPlan::stream_tokens(int64_t BT) const { return sp_ ? BT / group_.size() : BT; }

// Asked for every pass (the model sizes its buffers with stream_tokens alone): a micro-batch's
// tokens must split evenly (check_tp_layout refuses the configs where they would not).
int64_t TensorParallelPlan::stream_first(int64_t BT) const {
  LS_CHECK(!sp_ || BT % group_.size() == 0, "sequence parallelism: ", BT, " tokens over ", group_.size(), " ranks");
  return sp_ ? group_.rank() * stream_tokens(BT) : 0;
}

std::unique_ptr<NormOp> TensorParallelPlan::norm(const LayerDesc& layer) const {
  if (!sp_) return ModelPlan::norm(layer);
  return std::make_unique<SequenceParallelNorm>(layer, Group{group_, sp_, *scratch_});
}

std::unique_ptr<LinearOp> TensorParallelPlan::linear(const LayerDesc& layer, const ParamTensor& weight,
                                                     LinearRows rows) const {
  // Rows every rank holds whole combine like the stream without sequence parallelism.
  const Group g{group_, sp_ && rows == LinearRows::kStream, *scratch_};
  if (weight.split_dim == 0) return std::make_unique<ColumnParallelLinear>(g);
  if (weight.split_dim == 1) return std::make_unique<RowParallelLinear>(g);
  return ModelPlan::linear(layer, weight, rows);
}

void TensorParallelPlan::gather_stream(const float* stream, float* all, int64_t BT, int64_t C) const {
  if (!sp_) {
    ModelPlan::gather_stream(stream, all, BT, C);
    return;
  }
  group_.all_gather(stream, all, stream_tokens(BT) * C);
}

std::unique_ptr<EmbeddingOp> TensorParallelPlan::embedding(const LayerDesc& layer) const {
  return std::make_unique<VocabParallelEmbedding>(layer, Group{group_, sp_, *scratch_});
}

std::unique_ptr<LossOp> TensorParallelPlan::loss(const LayerDesc& layer) const {
  return std::make_unique<VocabParallelCrossEntropy>(layer, Group{group_, sp_, *scratch_});
}

}  // namespace lockstep::parallel
