// The tensor- and sequence-parallel pieces of Gpt (gpt.hpp): the row- and column-parallel
// linears, the vocabulary-parallel cross-entropy, the norm gathers under sequence parallelism.
// Each falls back to the one-device op when the model has no TpGroup, so gpt.cpp's forward and
// backward read the same for every layout.
#include <algorithm>

#include "kernels/ops/crossentropy.hpp"
#include "src/model/gpt.hpp"

namespace lockstep {

void Gpt::linear_forward_row(Mode mode, cpu::LinearShape s, float* out, const float* inp,
                             const ParamTensor* w, const ParamTensor* b) {
  if (!tp_) {
    cpu::linear_forward(mode, s, out, inp, p(w), p(b));
    return;
  }
  // out[n,o] = Σ over the input features, split across the group; under sequence parallelism
  // this rank keeps only its residual tokens' rows (a reduce-scatter instead of an all-reduce).
  const int64_t n = s.N * s.OC, rows = residual_tokens(s.N);
  if (mode == Mode::kCanonical) {
    tp_sum_.reset(static_cast<size_t>(n));
    cpu::linear_forward_partials(s, tp_sum_, inp, p(w));
    if (sp_) {
      tp_->reduce_scatter_exact(tp_sum_, out);
    } else {
      tp_->all_reduce_exact(tp_sum_, out);
    }
  } else if (sp_) {
    cpu::linear_forward(mode, s, tp_buf_.data(), inp, p(w), nullptr);
    tp_->reduce_scatter_sum(tp_buf_.data(), out, rows * s.OC);
  } else {
    cpu::linear_forward(mode, s, out, inp, p(w), nullptr);
    tp_->all_reduce_sum(out, n);
  }
  // The replicated bias, once, after the rounding: linear_forward's epilogue `dot + bias[o]`.
  if (const float* bias = p(b)) {
    for (int64_t i = 0; i < rows; ++i) {
      float* row = out + i * s.OC;
      for (int64_t o = 0; o < s.OC; ++o) row[o] = row[o] + bias[o];
    }
  }
}

void Gpt::linear_backward_column(cpu::LinearShape s, int64_t token_offset, float* dinp, GradSink dw,
                                 GradSink db, const float* dout, const float* inp, const ParamTensor* w) {
  if (!tp_) {
    cpu::linear_backward(mode_, s, token_offset, dinp, dw, db, dout, inp, p(w));
    return;
  }
  // Weight and bias gradients are this rank's rows; dinp sums over the output features, split
  // across the group (under sequence parallelism only this rank's residual tokens' rows: the
  // conjugate of the forward's all-gather), and is written like linear_backward's `dinp =`.
  cpu::linear_backward(mode_, s, token_offset, nullptr, dw, db, dout, inp, p(w));
  const int64_t n = s.N * s.IC, kept = residual_tokens(s.N) * s.IC;
  if (mode_ == Mode::kCanonical) {
    tp_sum_.reset(static_cast<size_t>(n));
    cpu::linear_backward_dinp_partials(s, tp_sum_, dout, p(w));
    if (sp_) {
      tp_->reduce_scatter_exact(tp_sum_, dinp);
    } else {
      tp_->all_reduce_exact(tp_sum_, dinp);
    }
  } else if (sp_) {
    cpu::linear_backward(mode_, s, token_offset, tp_buf_.data(), {}, {}, dout, inp, p(w));
    tp_->reduce_scatter_sum(tp_buf_.data(), dinp, kept);
  } else {
    cpu::linear_backward(mode_, s, token_offset, dinp, {}, {}, dout, inp, p(w));
    tp_->all_reduce_sum(dinp, n);
  }
}

void Gpt::crossentropy(int64_t BT, const int32_t* targets, float dloss, bool backward) {
  if (!tp_) {
    const cpu::CrossEntropyShape cs{BT, cfg_.vocab_size};
    if (backward) {
      cpu::crossentropy_forward_backward(mode_, cs, dloss, losses_.data(), logits_.data(), targets);
    } else {
      cpu::crossentropy_forward(mode_, cs, losses_.data(), logits_.data(), targets);
    }
    return;
  }
  // Vocabulary-parallel: the row max, the softmax denominator and the target's logit are
  // combined across the group (kernels/ops/crossentropy.hpp), then each rank finishes its columns.
  const cpu::CrossEntropyShard s{BT, local_.V, local_.v0, cfg_.vocab_size};
  cpu::crossentropy_shard_max(s, ce_max_.data(), logits_.data());
  tp_->all_reduce_max(ce_max_.data(), BT);
  tp_sum_.reset(static_cast<size_t>(BT));
  cpu::crossentropy_shard_partition(mode_, s, tp_sum_, ce_target_.data(), logits_.data(), ce_max_.data(),
                                    targets);
  tp_->all_reduce_exact(tp_sum_, ce_z_.data());
  tp_->all_reduce_sum(ce_target_.data(), BT);
  cpu::crossentropy_shard_finish(mode_, s, dloss, losses_.data(), backward ? logits_.data() : nullptr,
                                 logits_.data(), ce_max_.data(), ce_z_.data(), ce_target_.data(), targets);
}

void Gpt::norm_forward_gathered(Mode mode, int64_t BT, float* out, float* mean, float* rstd, const float* inp,
                                const ParamTensor* w, const ParamTensor* b) {
  const int64_t rows = residual_tokens(BT);
  norm_forward(mode, rows, sp_ ? sp_norm_.data() : out, mean, rstd, inp, w, b);
  if (sp_) tp_->all_gather(sp_norm_.data(), out, rows * cfg_.d_model);
}

const float* Gpt::gathered_dres(int64_t BT) {
  if (!sp_) return dres_.data();
  tp_->all_gather(dres_.data(), dres_full_.data(), residual_tokens(BT) * cfg_.d_model);
  return dres_full_.data();
}

cpu::EmbeddingShape Gpt::embedding_shape(int64_t B) const {
  cpu::EmbeddingShape es{B, cfg_.seq_len, cfg_.d_model, cfg_.vocab_size};
  if (tp_) {
    es.rows_first = local_.v0;
    es.rows = local_.V;
  }
  return es;
}

}  // namespace lockstep
