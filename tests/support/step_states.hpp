// Small in-memory states for the `verify step` engine (verify/step.hpp): a 2-layer model, its
// initial parameters, random small moments and a random batch, at step 3 of a 10-step schedule.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "src/model/model.hpp"
#include "verify/step.hpp"

namespace lockstep {

// A small trained-from-init state for the verify engine, of the model `edit` makes of the config's
// layer list (the list itself unless it edits it).
inline verify::StepState tiny_state(Mode mode, bool variant, const std::function<void(ModelDesc&)>& edit = {}) {
  verify::StepState s;
  ModelConfig& m = s.cfg.model;
  m.vocab_size = 67;
  m.seq_len = 16;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = variant ? 2 : 4;
  m.ffn = variant ? FfnKind::kSwiglu : FfnKind::kGelu;
  m.ffn_hidden = variant ? 48 : 0;
  m.norm = variant ? NormKind::kRmsNorm : NormKind::kLayerNorm;
  m.pos = variant ? PosKind::kRope : PosKind::kLearned;
  m.tie_embeddings = !variant;
  m.bias = !variant;
  m.seed = 5;
  TrainConfig& t = s.cfg.train;
  // Canonical: two micro-batches of 64 tokens (on chunk boundaries). Fast: one, to keep the
  // Bounded<mpfr> reference quick.
  t.batch_size = mode == Mode::kCanonical ? 8 : 4;
  t.micro_batch_size = 4;
  t.mode = mode;
  t.lr = 1e-2;
  t.steps = 10;
  t.warmup = 2;
  t.grad_clip = 0.5;  // small, so that clipping happens
  t.threads = 2;
  s.step = 3;
  s.model = describe_model(m);
  if (edit) {
    edit(s.model);
    declare_layers(s.model);
  }
  Model model(s.model, mode, 1);
  model.init_parameters();
  s.params.assign(model.params(), model.params() + model.num_params());
  std::mt19937 rng(11);
  std::normal_distribution<float> small(0.0f, 1e-3f);
  for (int64_t i = 0; i < model.num_params(); ++i) {
    s.m.push_back(small(rng));
    s.v.push_back(std::fabs(small(rng)) * 1e-3f);
  }
  for (int64_t i = 0; i < t.batch_size * m.seq_len; ++i) {
    s.inputs.push_back(static_cast<int32_t>(rng() % m.vocab_size));
    s.targets.push_back(static_cast<int32_t>(rng() % m.vocab_size));
  }
  return s;
}

// Every tensor of the report within its tolerance; prints the worst.
inline void expect_verify_pass(const verify::StepReport& r) {
  for (const auto& row : r.rows) EXPECT_TRUE(row.cmp.ok()) << row.cmp.summary(row.name);
  EXPECT_TRUE(r.ok());
  std::printf("%s vs %s: %zu tensors, worst %s, worst tightness %.3g, reference %.2f s\n",
              r.mode.c_str(), r.reference.c_str(), r.rows.size(), r.worst()->name.c_str(),
              r.worst_tightness(), r.reference_seconds);
}

}  // namespace lockstep
