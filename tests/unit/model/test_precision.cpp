// The bf16 recipe (src/model/precision.hpp) as the model applies it: which linears an
// fp32_linears entry names; in a bf16 model, every tensor a bf16 linear reads or writes holds bf16
// values (the activations it reads, its products, its input gradients) while the residual stream,
// the losses and the master weights stay fp32; a linear kept in fp32 reads and writes fp32; and a
// bf16 product is exactly the canonical fp32 linear of the rounded operands, rounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/model/model.hpp"

namespace lockstep {
namespace {

TEST(PrecisionRecipe, EntriesNameLinearsOrPrefixesAtASlash) {
  PrecisionRecipe r;
  r.linears = Precision::kBf16;
  r.fp32_linears = {"head", "layer/1", "layer/2/mlp/"};
  EXPECT_EQ(r.of_linear("head"), Precision::kF32);
  EXPECT_EQ(r.of_linear("layer/1/attn/qkv"), Precision::kF32);
  EXPECT_EQ(r.of_linear("layer/10/attn/qkv"), Precision::kBf16);  // not a prefix at a '/'
  EXPECT_EQ(r.of_linear("layer/2/mlp/fc"), Precision::kF32);
  EXPECT_EQ(r.of_linear("layer/2/attn/proj"), Precision::kBf16);
  PrecisionRecipe f32 = r;
  f32.linears = Precision::kF32;
  EXPECT_EQ(f32.of_linear("layer/0/mlp/fc"), Precision::kF32);

  const ModelDesc desc = describe_model({.vocab_size = 64, .seq_len = 8, .d_model = 16, .n_layers = 2, .n_heads = 2,
                                                .n_kv_heads = 2});
  const std::vector<std::string> names = linear_names(desc);
  const std::vector<std::string> want = {"layer/0/attn/qkv", "layer/0/attn/proj", "layer/0/mlp/fc",
                                         "layer/0/mlp/proj", "layer/1/attn/qkv", "layer/1/attn/proj",
                                         "layer/1/mlp/fc",   "layer/1/mlp/proj", "head"};
  EXPECT_EQ(names, want);
  r.fp32_linears = {"head", "layer/1"};
  EXPECT_EQ(PrecisionRecipe::unmatched(r.fp32_linears, desc), "");
  r.fp32_linears = {"head", "layer/2"};
  EXPECT_EQ(PrecisionRecipe::unmatched(r.fp32_linears, desc), "layer/2");
  r.fp32_linears = {"layer/0/mlp/f"};
  EXPECT_EQ(PrecisionRecipe::unmatched(r.fp32_linears, desc), "layer/0/mlp/f");
}

bool all_bf16(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return (std::bit_cast<uint32_t>(x) & 0xffffu) == 0; });
}

// One step's forward and backward of a two-layer model in `mode` with recipe r, and every tensor
// it observed.
struct Observed {
  std::unique_ptr<Model> model;
  std::map<std::string, std::vector<float>> seen;
};

Observed observed_step(Mode mode, const PrecisionRecipe& r) {
  const ModelConfig cfg{.vocab_size = 96, .seq_len = 32, .d_model = 64, .n_layers = 2, .n_heads = 4, .seed = 3};
  Observed o{std::make_unique<Model>(cfg, mode, 2, ModelOptions{.precision = r}), {}};
  Model* model = o.model.get();
  model->init_parameters();
  auto& seen = o.seen;
  model->set_hook([&](std::string_view name, const TensorView& t) {
    const float* p = t.f32();
    seen[std::string(name)].assign(p, p + t.numel());
  });
  std::mt19937 gen(5);
  std::vector<int32_t> tok(2 * 32 + 1);
  for (auto& x : tok) x = static_cast<int32_t>(gen() % 96);
  model->zero_grad();
  ChunkCombiner loss;
  model->forward_backward_batch(tok.data(), tok.data() + 1, 2, 2, 0, 1.0f / 64, loss);
  model->set_hook({});
  return o;
}

TEST(PrecisionRecipe, Bf16LinearsReadAndWriteBf16AndTheRestStaysFp32) {
  PrecisionRecipe bf16;
  bf16.linears = Precision::kBf16;
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    SCOPED_TRACE(mode_name(mode));
    const Observed o = observed_step(mode, bf16);
    const auto& seen = o.seen;
    const Model* model = o.model.get();
    for (const char* name : {"layer/0/ln1/out", "layer/0/attn/qkv", "layer/0/attn/out", "layer/0/ln2/out",
                             "layer/0/mlp/fc", "layer/0/mlp/act", "lnf/out", "logits", "grad/layer/0/ln1/out",
                             "grad/layer/1/mlp/act", "grad/layer/1/attn/out", "grad/lnf/out"}) {
      ASSERT_TRUE(seen.count(name)) << name;
      EXPECT_TRUE(all_bf16(seen.at(name))) << name << " is not stored in bf16";
    }
    for (const char* name : {"embed/out", "layer/0/attn/res", "layer/1/mlp/res", "losses", "grad/layer/0/attn/res"}) {
      ASSERT_TRUE(seen.count(name)) << name;
      EXPECT_FALSE(all_bf16(seen.at(name))) << name << " should stay fp32";
    }
    const std::vector<float> master(model->params(), model->params() + model->num_params());
    EXPECT_FALSE(all_bf16(master)) << "the master weights are fp32";
  }
  PrecisionRecipe head_f32 = bf16;
  head_f32.fp32_linears = {"head"};
  const auto seen = observed_step(Mode::kCanonical, head_f32).seen;
  EXPECT_FALSE(all_bf16(seen.at("lnf/out")));
  EXPECT_FALSE(all_bf16(seen.at("logits")));
  EXPECT_TRUE(all_bf16(seen.at("layer/1/mlp/act")));
}

// qkv = bf16(linear(ln1/out, bf16(W)) + b) in canonical mode: the CPU backend's own fp32 linear on
// the rounded operands, rounded — what a bf16-input GEMM with fp32 accumulation gives.
TEST(PrecisionRecipe, ABf16ProductIsTheFp32LinearOfTheRoundedOperandsRounded) {
  PrecisionRecipe bf16;
  bf16.linears = Precision::kBf16;
  const Observed o = observed_step(Mode::kCanonical, bf16);
  const auto& seen = o.seen;
  Model* model = o.model.get();
  const ParamTensor& w = model->param("layer/0/attn/qkv/weight");
  const ParamTensor& b = model->param("layer/0/attn/qkv/bias");
  CpuBackend cpu = CpuBackend::current();
  std::vector<float> wb(model->params() + w.offset, model->params() + w.offset + w.numel);
  cpu.round_to_bf16(w.numel, wb.data(), wb.data());
  ASSERT_EQ(0, std::memcmp(wb.data(), model->weight_copy(w), wb.size() * sizeof(float)));
  const std::vector<float>& ln = seen.at("layer/0/ln1/out");
  const int64_t N = 64, IC = 64, OC = w.numel / IC;
  std::vector<float> out(static_cast<size_t>(N * OC));
  cpu.linear_forward(Mode::kCanonical, {N, IC, OC}, out.data(), ln.data(), wb.data(), model->params() + b.offset);
  cpu.round_to_bf16(N * OC, out.data(), out.data());
  EXPECT_EQ(0, std::memcmp(out.data(), seen.at("layer/0/attn/qkv").data(), out.size() * sizeof(float)));
}

// The bf16 copies of the weights are made from the parameters at each step's first micro-batch
// and reused by its others: after a step of four micro-batches the copy is the rounding of the
// parameters it ran on, after the parameters change the next step's copy is theirs, and a change
// in the middle of a step reaches the copies only at the next micro-batch 0.
TEST(PrecisionRecipe, WeightCopiesAreMadeAtEachStepsFirstMicroBatch) {
  PrecisionRecipe bf16;
  bf16.linears = Precision::kBf16;
  const ModelConfig cfg{.vocab_size = 96, .seq_len = 64, .d_model = 64, .n_layers = 2, .n_heads = 4, .seed = 3};
  Model model(cfg, Mode::kCanonical, 1, ModelOptions{.precision = bf16});
  model.init_parameters();
  const ParamTensor& w = model.param("layer/1/mlp/fc/weight");
  CpuBackend cpu = CpuBackend::current();
  const auto copy_is_rounded_params = [&] {
    std::vector<float> want(model.params() + w.offset, model.params() + w.offset + w.numel);
    cpu.round_to_bf16(w.numel, want.data(), want.data());
    return std::memcmp(want.data(), model.weight_copy(w), want.size() * sizeof(float)) == 0;
  };
  const auto halve_params = [&] {
    for (int64_t i = 0; i < model.num_params(); ++i) model.params()[i] *= 0.5f;
  };
  std::mt19937 gen(7);
  std::vector<int32_t> tok(4 * 64 + 1);
  for (auto& x : tok) x = static_cast<int32_t>(gen() % 96);
  ChunkCombiner loss;
  const auto step = [&] {
    model.zero_grad();
    model.forward_backward_batch(tok.data(), tok.data() + 1, 4, 1, 0, 1.0f / 256, loss);
  };
  step();
  EXPECT_TRUE(copy_is_rounded_params());
  halve_params();
  EXPECT_FALSE(copy_is_rounded_params());
  step();
  EXPECT_TRUE(copy_is_rounded_params()) << "the second step ran on the first step's copies";

  model.zero_grad();
  model.forward(0, {tok.data(), tok.data() + 1, 1, 0});
  model.backward(0, 1.0f / 256, loss, false);
  halve_params();
  model.forward(1, {tok.data() + 64, tok.data() + 65, 1, 64});
  model.backward(1, 1.0f / 256, loss, true);
  EXPECT_FALSE(copy_is_rounded_params()) << "micro-batch 1 made the copies again";
  model.forward(0, {tok.data(), tok.data() + 1, 1, 0});
  EXPECT_TRUE(copy_is_rounded_params());
}

}  // namespace
}  // namespace lockstep
