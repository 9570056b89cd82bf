#include "src/plan/kernel_traffic.hpp"

namespace lockstep::plan {

namespace {

constexpr double kF32 = 4;  // the stream, its gradient, scores, probabilities, logits

// An activation's forward and backward bytes: `in` features read (the first linear's output) and
// `out` written, then the backward's input and gradient read and the input's gradient written.
Traffic activation(double in, double out, double bytes) {
  return {bytes * (in + out), bytes * (2 * in + out)};
}

}  // namespace

Traffic layer_traffic(const LayerDesc& l, int64_t tp, bool sp, Precision precision, double routed_load) {
  const LayerDims& m = l.dims;
  const auto t = static_cast<double>(tp);
  const double ab = precision == Precision::kF32 ? 4 : 2;
  const double C = static_cast<double>(m.C);
  const double stream = C * (sp ? 1 / t : 1);  // the stream's features a rank's op covers a token
  const Traffic norm{(kF32 + ab) * stream, (2 * kF32 + ab) * stream};
  const Traffic residual{(2 * kF32 + ab) * stream, 3 * kF32 * stream};
  const double gated = l.ffn == FfnKind::kSwiglu ? 2 : 1;  // SwiGLU's first linear: gate and value
  Traffic sum;
  const auto add = [&](Traffic x) {
    sum.forward += x.forward;
    sum.backward += x.backward;
  };
  switch (l.kind) {
    case LayerKind::kEmbedding: {
      const double tables = l.pos == PosKind::kLearned ? 2 : 1;  // wte, and wpe
      add({kF32 * C * (tables + 1), kF32 * C * (1 + 2 * tables)});
      break;
    }
    case LayerKind::kAttention: {
      add(norm);
      add(residual);
      const double scores = static_cast<double>(m.NH) / t * static_cast<double>(m.T);
      add({2 * kF32 * scores, 3 * kF32 * scores});
      if (l.pos == PosKind::kRope) {
        const double qk = 2 * ab * static_cast<double>((m.NH + m.NKV) * m.HS) / t;
        add({qk, qk});
      }
      break;
    }
    case LayerKind::kMlp: {
      add(norm);
      add(residual);
      const double F = static_cast<double>(m.F) / t;
      add(activation(gated * F, F, ab));
      break;
    }
    case LayerKind::kMoe: {
      add(norm);
      add(residual);
      const double K = static_cast<double>(l.top_k) * routed_load;
      const double F = static_cast<double>(m.F) / t;
      const Traffic expert = activation(gated * F, F, ab);
      const double rows = 4 * ab * C;  // a choice's row to its expert and back
      add({K * (rows + expert.forward), K * (rows + expert.backward)});
      if (l.shared_F > 0) {
        const double S = static_cast<double>(l.shared_F) / t;
        add(activation(gated * S, S, ab));
      }
      break;
    }
    case LayerKind::kFinalNorm:
      add(norm);
      break;
    case LayerKind::kHead: {
      const double V = static_cast<double>(m.V) / t;
      add({2 * kF32 * V, 2 * kF32 * V});
      break;
    }
  }
  return sum;
}

double update_traffic(double gradients, double updated, double updated_matmul, Precision precision) {
  // The gradient zeroed (a write) and read for its norm; AdamW's 4 reads and 3 writes.
  return 2 * kF32 * gradients + 7 * kF32 * updated + (precision == Precision::kF32 ? 0 : 2) * updated_matmul;
}

}  // namespace lockstep::plan
