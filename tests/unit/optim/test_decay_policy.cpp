// AdamW's weight-decay policy (src/optim/decay_policy.hpp): which tensors the default decays (by
// name, for a model with every kind of parameter), parsing [train] weight_decay_on and its errors,
// an update with zero gradients (a decayed element moves by exactly fl(p − fl(lr·fl(wd·p))), any
// other stays bit for bit), and the step against the reference with decay on for other classes.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "src/core/formats.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/optim/decay_policy.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/step_states.hpp"

namespace lockstep {
namespace {

// Biases, LayerNorm, learned positions and an untied head: every class of parameter.
ModelConfig every_class_model() {
  return {.vocab_size = 40, .seq_len = 8, .d_model = 16, .n_layers = 1, .n_heads = 4, .norm = NormKind::kLayerNorm,
          .pos = PosKind::kLearned, .tie_embeddings = false, .bias = true, .seed = 2};
}

std::set<std::string> decayed_names(const DecayPolicy& policy) {
  std::set<std::string> out;
  for (const auto& t : build_param_layout(describe_model(every_class_model())))
    if (policy.decays(t.klass)) out.insert(t.name);
  return out;
}

TEST(DecayPolicy, DefaultDecaysMatricesAndEmbeddingsOnly) {
  EXPECT_EQ(decayed_names(DecayPolicy{}),
            (std::set<std::string>{"wte", "wpe", "layer/0/attn/qkv/weight", "layer/0/attn/proj/weight",
                                   "layer/0/mlp/fc/weight", "layer/0/mlp/proj/weight", "lm_head/weight"}));
  EXPECT_EQ(DecayPolicy::parse("matrices,embeddings", "x").classes, DecayPolicy{}.classes);
}

TEST(DecayPolicy, ParseNamesClassesAndRejectsUnknownOrRepeated) {
  EXPECT_TRUE(decayed_names(DecayPolicy::parse("none", "x")).empty());
  EXPECT_TRUE(decayed_names(DecayPolicy::parse("", "x")).empty());
  std::set<std::string> norms_and_biases;
  for (const auto& t : build_param_layout(describe_model(every_class_model())))
    if (t.name.ends_with("bias") || t.name.find("ln") != std::string::npos) norms_and_biases.insert(t.name);
  EXPECT_EQ(decayed_names(DecayPolicy::parse("biases,norms", "x")), norms_and_biases);
  EXPECT_EQ(norms_and_biases.size(), 10u);  // 4 linear biases, ln1, ln2, lnf weight and bias
  const auto error = [](const char* list) {
    return test::config_error([&] { DecayPolicy::parse(list, "c.toml: [train] weight_decay_on"); });
  };
  EXPECT_TRUE(test::matches(error("matrices,weights"),
                            "c.toml: \\[train\\] weight_decay_on: unknown parameter class \"weights\" in "
                            "\"matrices,weights\"; expected a comma-separated list of \"matrices\", "
                            "\"embeddings\", \"norms\", \"biases\", or \"none\""));
  EXPECT_TRUE(test::matches(error("norms,norms"), ".*\"norms\" named twice in \"norms,norms\""));
  EXPECT_TRUE(test::matches(error("matrices,"), ".*unknown parameter class \"\" in \"matrices,\".*"));
}

TEST(DecayPolicy, ZeroGradientUpdateDecaysExactlyThePolicysTensors) {
  for (const char* list : {"matrices,embeddings", "norms", "none"}) {
    SCOPED_TRACE(list);
    Model model(describe_model(every_class_model()), Mode::kCanonical, 1);
    model.init_parameters();
    // Norm gains start at 1 and biases at 0: give every element a value that decay would change.
    for (int64_t i = 0; i < model.num_params(); ++i) model.params()[i] += 0.25f;
    const std::vector<float> before(model.params(), model.params() + model.num_params());
    model.zero_grad();
    AdamWConfig cfg;
    cfg.weight_decay = 0.1f;
    cfg.decay = DecayPolicy::parse(list, "test");
    AdamW opt(model, cfg);
    const float lr = 0.01f;
    opt.update(model, lr, 1);
    for (const auto& t : model.param_layout()) {
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        const float p = before[static_cast<size_t>(i)];
        const float want = cfg.decay.decays(t.klass) ? p - lr * (0.0f + cfg.weight_decay * p) : p;
        ASSERT_EQ(f32_bits(model.params()[i]), f32_bits(want)) << t.name << "[" << i - t.offset << "]";
      }
    }
  }
}

// The reference decays by the same classes: a canonical step bitwise, a fast step within bounds,
// with decay on norms and biases only and with no decay.
TEST(DecayPolicy, StepWithOtherPoliciesMatchesTheReference) {
  verify::StepOptions fast;
  fast.reference_bits = 128;
  for (const char* list : {"norms,biases", "none"}) {
    SCOPED_TRACE(list);
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      verify::StepState s = tiny_state(mode, false);
      s.cfg.train.weight_decay = 0.5;  // large, so that a wrong mask is far outside any bound
      s.cfg.train.weight_decay_on = list;
      expect_verify_pass(verify::verify_step(s, mode == Mode::kFast ? fast : verify::StepOptions{}));
    }
  }
}

}  // namespace
}  // namespace lockstep
