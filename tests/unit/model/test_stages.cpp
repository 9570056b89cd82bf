// A model run as pipeline stages: two Models over layers [0, k) and [k, n) of one list, the first
// holding several micro-batches between their forward and their backward (what a 1F1B schedule
// needs), backwards in another order than the forwards; with tied embeddings the last stage's head
// computes with a copy of wte whose exact gradient sums join the first stage's. Canonical gradients
// and the loss must be bitwise those of the whole model run one micro-batch after the other, for
// every cut, and with the backward split into its input- and weight-gradient passes.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/formats.hpp"
#include "src/model/model.hpp"

namespace lockstep {
namespace {

ModelConfig stage_model() {
  return {.vocab_size = 96, .seq_len = 64, .d_model = 64, .n_layers = 2, .n_heads = 4, .tie_embeddings = false,
          .seed = 3};
}

constexpr int64_t kMicro = 4;  // micro-batches of one sequence

std::vector<int32_t> tokens(const ModelConfig& m) {
  std::mt19937 gen(9);
  std::vector<int32_t> t(static_cast<size_t>(kMicro * m.seq_len + 1));
  for (auto& x : t) x = static_cast<int32_t>(gen() % static_cast<uint32_t>(m.vocab_size));
  return t;
}

// A test's model (tied or not), its tokens, and the whole model's step over them in kMicro
// micro-batches of one sequence: its rounded gradients and its loss.
struct WholeStep {
  explicit WholeStep(bool tied) {
    cfg.tie_embeddings = tied;
    desc = describe_model(cfg);
    model = std::make_unique<Model>(desc, Mode::kCanonical, 1);
    model->init_parameters();
    model->zero_grad();
    ChunkCombiner sum;
    model->forward_backward_batch(tok.data(), tok.data() + 1, kMicro, 1, 0, dloss, sum);
    model->finish_grads();
    loss = sum.finish();
  }
  ModelConfig cfg = stage_model();
  ModelDesc desc;
  std::vector<int32_t> tok = tokens(cfg);
  float dloss = 1.0f / static_cast<float>(kMicro * cfg.seq_len);
  std::unique_ptr<Model> model = nullptr;
  float loss = 0;
};

// A tied head's exact sums of wte's gradient (on `head`, a copy of wte) join the embedding's in
// its last micro-batch.
void add_head_grad(Model& embedding, const Model& head) {
  embedding.add_to_tied_grad([&head](const GradSink& sink) {
    const ExactAccumulator& e = head.tied_copy_exact();
    for (size_t i = 0; i < e.size(); ++i) {
      if (e.spilled(i)) {
        sink.exact->add(static_cast<size_t>(sink.offset) + i, e.spill(i));
      } else {
        sink.exact->add(static_cast<size_t>(sink.offset) + i, e.partial_sums()[i]);
      }
    }
  });
}

// Every gradient `part` holds is bitwise the whole model's of the same tensor.
void expect_whole_grads(const Model& part, const Model& whole) {
  for (const auto& t : part.param_layout()) {
    const ParamTensor& w = whole.param(t.name);
    ASSERT_EQ(t.numel, w.numel) << t.name;
    for (int64_t i = 0; i < t.numel; ++i) {
      ASSERT_EQ(f32_bits(part.grads()[t.offset + i]), f32_bits(whole.grads()[w.offset + i])) << t.name << " " << i;
    }
  }
}

// With a split backward (a zero-bubble schedule) each backward leaves the linears' weight
// gradients to a weight pass run later, in another order; a micro-batch holds its slot until then.
TEST(ModelStages, TwoStagesWithMicroBatchesInFlightGiveTheWholeModelsBits) {
  for (bool tied : {false, true}) {
    const WholeStep w(tied);
    const ModelDesc& desc = w.desc;
    const int64_t T = w.cfg.seq_len;
    const Model& whole = *w.model;

    for (bool split : {false, true}) {
      for (size_t cut = 1; cut + 1 < desc.layers.size(); ++cut) {
        SCOPED_TRACE(testing::Message() << (tied ? "tied" : "untied") << (split ? ", split backward" : "")
                                        << ", stages [0, " << cut << ") and [" << cut << ", " << desc.layers.size()
                                        << ")");
        Model first(desc, Mode::kCanonical, 1,
                    {.chunks = {{.end = cut, .slots = static_cast<int>(kMicro)}}, .split_backward = split});
        Model last(desc, Mode::kCanonical, 1, {.chunks = {{.first = cut, .slots = 2}}, .split_backward = split});
        ASSERT_EQ(first.num_params() + last.num_params(), whole.num_params());
        first.init_parameters();
        last.init_parameters();
        // A tied head computes with a copy of the first stage's wte.
        ASSERT_EQ(last.tied_copy().size(), tied ? static_cast<size_t>(first.param("wte").numel) : 0u);
        std::copy(first.params(), first.params() + last.tied_copy().size(), last.tied_copy().begin());
        first.zero_grad();
        last.zero_grad();
        const int64_t rows = first.stream_tokens(1) * w.cfg.d_model;
        // All forwards of the first stage, then each micro-batch through the last stage (split:
        // its weight pass one micro-batch later), the first stage's backwards in the order 0, 2,
        // 1, 3 (split: then its weight passes in the order 3, 0, 2, 1).
        std::vector<std::vector<float>> grads_in(kMicro);
        ChunkCombiner loss;
        for (int64_t mb = 0; mb < kMicro; ++mb) {
          const MicroBatch batch{w.tok.data() + mb * T, w.tok.data() + mb * T + 1, 1, mb * T};
          first.forward(mb, batch);
          std::copy(first.stage_output(mb), first.stage_output(mb) + rows, last.stage_input(mb));
          last.forward(mb, batch);
          last.backward(mb, w.dloss, loss, mb == kMicro - 1);
          grads_in[static_cast<size_t>(mb)].assign(last.stage_input_grad(), last.stage_input_grad() + rows);
          if (split && mb == 1) {
            EXPECT_THROW(last.stage_input(kMicro), InternalError);  // 0 and 1 hold both slots
          }
          if (split && mb > 0) last.backward_weight(mb - 1, false);
        }
        if (split) last.backward_weight(kMicro - 1, true);
        add_head_grad(first, last);
        for (int64_t mb : {0, 2, 1, 3}) {
          const auto& g = grads_in[static_cast<size_t>(mb)];
          std::copy(g.begin(), g.end(), first.stage_output_grad());
          first.backward(mb, w.dloss, loss, mb == 3);
        }
        if (split) {
          for (int64_t mb : {3, 0, 2, 1}) first.backward_weight(mb, mb == 1);
        }
        first.finish_grads();
        last.finish_grads();
        EXPECT_EQ(f32_bits(loss.finish()), f32_bits(w.loss));
        expect_whole_grads(first, whole);
        expect_whole_grads(last, whole);
      }
    }
  }
}

// Interleaving: four stages of the list on two models, each holding two of them as chunks (stages
// 0 and 2, 1 and 3: an interleaved pipeline of two ranks and two virtual stages). Every micro-batch
// goes forward through the stages in order and backward in reverse, the forwards of all first,
// the backwards in another order; the loss and every gradient are bitwise the whole model's.
TEST(ModelStages, InterleavedChunksGiveTheWholeModelsBits) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const WholeStep w(tied);
    const ModelDesc& desc = w.desc;
    const int64_t T = w.cfg.seq_len;
    const Model& whole = *w.model;

    const size_t n = desc.layers.size();
    const size_t cuts[5] = {0, 2, n / 2, n - 2, n};  // stage s: layers [cuts[s], cuts[s + 1])
    const auto chunk = [&](size_t stage) { return LayerChunk{cuts[stage], cuts[stage + 1], static_cast<int>(kMicro)}; };
    Model r0(desc, Mode::kCanonical, 1, {.chunks = {chunk(0), chunk(2)}});
    Model r1(desc, Mode::kCanonical, 1, {.chunks = {chunk(1), chunk(3)}});
    ASSERT_EQ(r0.num_chunks(), 2u);
    ASSERT_EQ(r0.num_params() + r1.num_params(), whole.num_params());
    r0.init_parameters();
    r1.init_parameters();
    ASSERT_EQ(r1.tied_copy().size(), tied ? static_cast<size_t>(r0.param("wte").numel) : 0u);
    std::copy(r0.params(), r0.params() + r1.tied_copy().size(), r1.tied_copy().begin());
    r0.zero_grad();
    r1.zero_grad();
    const int64_t rows = r0.stream_tokens(1) * w.cfg.d_model;
    // Stage s is chunk s / 2 of model s % 2.
    Model* holder[2] = {&r0, &r1};
    ChunkCombiner loss;
    for (int64_t mb = 0; mb < kMicro; ++mb) {
      const MicroBatch batch{w.tok.data() + mb * T, w.tok.data() + mb * T + 1, 1, mb * T};
      for (size_t st = 0; st < 4; ++st) {
        Model& m = *holder[st % 2];
        if (st > 0) {
          const float* out = holder[(st - 1) % 2]->stage_output(mb, (st - 1) / 2);
          std::copy(out, out + rows, m.stage_input(mb, st / 2));
        }
        m.forward(mb, batch, st / 2);
      }
    }
    if (tied) add_head_grad(r0, r1);
    for (int64_t mb : {1, 3, 0, 2}) {
      std::vector<float> grad;
      for (size_t st = 4; st-- > 0;) {
        Model& m = *holder[st % 2];
        if (st < 3) std::copy(grad.begin(), grad.end(), m.stage_output_grad());
        m.backward(mb, w.dloss, loss, mb == 2, st / 2);
        if (st > 0) grad.assign(m.stage_input_grad(), m.stage_input_grad() + rows);
      }
    }
    r0.finish_grads();
    r1.finish_grads();
    EXPECT_EQ(f32_bits(loss.finish()), f32_bits(w.loss));
    expect_whole_grads(r0, whole);
    expect_whole_grads(r1, whole);
  }
}

TEST(ModelStages, MoreMicroBatchesInFlightThanSlotsAreRefused) {
  const ModelConfig cfg = stage_model();
  const std::vector<int32_t> tok = tokens(cfg);
  Model model(describe_model(cfg), Mode::kCanonical, 1, {.chunks = {{.slots = 2}}});
  model.init_parameters();
  const MicroBatch batch{tok.data(), tok.data() + 1, 1, 0};
  model.forward(0, batch);
  EXPECT_THROW(model.forward(0, batch), InternalError);  // already in flight
  model.forward(1, batch);
  EXPECT_THROW(model.forward(2, batch), InternalError);
  ChunkCombiner loss;
  model.backward(1, 1.0f, loss, false);
  EXPECT_NO_THROW(model.forward(2, batch));
  EXPECT_THROW(model.backward(3, 1.0f, loss, false), InternalError);  // no forward of 3
}

}  // namespace
}  // namespace lockstep
