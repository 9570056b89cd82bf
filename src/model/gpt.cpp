#include "src/model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops/activation.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/norm.hpp"
#include "src/core/check.hpp"
#include "src/core/det_math.hpp"
#include "src/core/hash.hpp"

namespace lockstep {

namespace {

// splitmix64 (Steele, Lea, Flood 2014) as a counter-based generator: a bijective mix of
// key + counter, so element i's draw does not depend on which elements were drawn before.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from the top 53 bits, never 0 (Box-Muller takes its log).
double uniform_open(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53; }

// Standard normal for element i of a tensor keyed by `key` (Box-Muller, cosine branch), with the
// deterministic log/cos of det_math.hpp so every machine draws the same initial model.
double normal_at(uint64_t key, uint64_t i) {
  const double u1 = uniform_open(splitmix64(key ^ splitmix64(2 * i)));
  const double u2 = uniform_open(splitmix64(key ^ splitmix64(2 * i + 1)));
  return std::sqrt(-2.0 * det::log(u1)) * det::cos(2.0 * det::kPi * u2);
}

}  // namespace

Gpt::Gpt(const ModelConfig& cfg, Mode mode, int64_t micro_batch, TpGroup* tp, bool sequence_parallel)
    : cfg_(cfg), mode_(mode), max_batch_(micro_batch), tp_(tp), sp_(sequence_parallel && tp != nullptr) {
  cfg_.validate();
  LS_REQUIRE(micro_batch >= 1, "micro batch size (", micro_batch, ") must be >= 1");
  const int64_t p = tp_ ? tp_->size() : 1, r = tp_ ? tp_->rank() : 0, HS = cfg_.head_size();
  LS_CHECK(cfg_.n_heads % p == 0 && cfg_.n_kv_heads % p == 0 && cfg_.ffn_width() % p == 0 &&
               cfg_.vocab_size % p == 0, "tensor-parallel split over ", p, " ranks (checked by src/parallel)");
  local_.NH = cfg_.n_heads / p;
  local_.NKV = cfg_.n_kv_heads / p;
  local_.qkv = (local_.NH + 2 * local_.NKV) * HS;
  local_.attn = local_.NH * HS;
  local_.F = cfg_.ffn_width() / p;
  local_.V = cfg_.vocab_size / p;
  local_.v0 = r * local_.V;
  build_layout();
  params_.assign(layout_.back().offset + layout_.back().numel, 0.0f);
  allocate_activations();
}

void Gpt::build_layout() {
  layout_ = build_param_layout(cfg_, {tp_ ? tp_->size() : 1, tp_ ? tp_->rank() : 0});
  // Pointers into layout_ are taken now that it is complete (the vector no longer reallocates).
  auto find = [&](const std::string& name) -> const ParamTensor* {
    for (const auto& t : layout_)
      if (t.name == name) return &t;
    return nullptr;
  };
  wte_ = find("wte");
  wpe_ = find("wpe");
  lnf_w_ = find("lnf/weight");
  lnf_b_ = find("lnf/bias");
  head_ = cfg_.tie_embeddings ? wte_ : find("lm_head/weight");
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "layer/" + std::to_string(l) + "/";
    layers_.push_back({find(p + "ln1/weight"), find(p + "ln1/bias"), find(p + "attn/qkv/weight"),
                       find(p + "attn/qkv/bias"), find(p + "attn/proj/weight"),
                       find(p + "attn/proj/bias"), find(p + "ln2/weight"), find(p + "ln2/bias"),
                       find(p + "mlp/fc/weight"), find(p + "mlp/fc/bias"),
                       find(p + "mlp/proj/weight"), find(p + "mlp/proj/bias")});
  }
}

const ParamTensor& Gpt::param(const std::string& name) const {
  for (const auto& t : layout_)
    if (t.name == name) return t;
  throw InternalError(str_cat("no parameter named ", name));
}

void Gpt::allocate_activations() {
  const int64_t BT = max_batch_ * cfg_.seq_len, C = cfg_.d_model, V = local_.V;
  const int64_t T = cfg_.seq_len, F = local_.F, A = local_.attn;
  const int64_t fc_out = cfg_.ffn == FfnKind::kSwiglu ? 2 * F : F;
  const int64_t att = max_batch_ * local_.NH * T * T;
  const int64_t BS = residual_tokens(BT);  // the residual stream's tokens here
  encoded_.resize(BS * C);
  acts_.resize(cfg_.n_layers);
  for (auto& a : acts_) {
    a.ln1.resize(BT * C);
    a.ln1_mean.resize(BS);
    a.ln1_rstd.resize(BS);
    a.qkv.resize(BT * local_.qkv);
    a.att.resize(att);
    a.atty.resize(BT * A);
    a.res_attn.resize(BS * C);
    a.ln2.resize(BT * C);
    a.ln2_mean.resize(BS);
    a.ln2_rstd.resize(BS);
    a.fch.resize(BT * fc_out);
    a.fch_act.resize(BT * F);
    a.res_mlp.resize(BS * C);
  }
  lnf_.resize(BT * C);
  lnf_mean_.resize(BS);
  lnf_rstd_.resize(BS);
  logits_.resize(BT * V);
  losses_.resize(BT);
  dres_.resize(BS * C);
  dbuf_c_.resize(BS * C);
  dqkv_.resize(BT * local_.qkv);
  datty_.resize(BT * A);
  datt_.resize(att);
  dfch_.resize(BT * fc_out);
  dfch_act_.resize(BT * F);
  if (tp_) {
    tp_buf_.resize(BT * C);
    ce_max_.resize(BT);
    ce_z_.resize(BT);
    ce_target_.resize(BT);
  }
  if (sp_) {
    sp_norm_.resize(BS * C);
    dres_full_.resize(BT * C);
  }
  if (cfg_.pos == PosKind::kRope) {
    const int64_t half = cfg_.head_size() / 2;
    rope_cos_.resize(T * half);
    rope_sin_.resize(T * half);
    cpu::rope_tables(T, cfg_.head_size(), cfg_.rope_theta, rope_cos_.data(), rope_sin_.data());
  }
}

void Gpt::init_parameters() {
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layers));
  for (const auto& t : layout_) {
    float* w = params_.data() + t.offset;
    const bool is_norm = t.name.find("ln") != std::string::npos && t.name.find("/weight") != std::string::npos;
    const bool is_bias = t.name.size() >= 5 && t.name.compare(t.name.size() - 5, 5, "/bias") == 0;
    if (is_norm) {
      std::fill(w, w + t.numel, 1.0f);
    } else if (is_bias) {
      std::fill(w, w + t.numel, 0.0f);
    } else {
      // GPT-2: projections into the residual stream are scaled down by 1/sqrt(2L).
      const bool residual_proj = t.name.find("/proj/weight") != std::string::npos;
      const double stddev = static_cast<double>(cfg_.init_std) * (residual_proj ? residual_scale : 1.0f);
      const uint64_t key = xxh64(t.name.data(), t.name.size(), cfg_.seed);
      for (int64_t i = 0; i < t.numel; ++i) {
        w[i] = static_cast<float>(stddev * normal_at(key, static_cast<uint64_t>(t.global_index(i))));
      }
    }
  }
}

double Gpt::flops_per_token() const {
  double matmul_params = 0;  // of the whole model, whatever this rank holds
  for (const auto& t : layout_) {
    if (t.shape.size() == 2 && t.name != "wpe" && !(t.name == "wte" && !cfg_.tie_embeddings)) {
      matmul_params += static_cast<double>(t.global_numel());
    }
  }
  return 6.0 * matmul_params +
         12.0 * cfg_.n_layers * static_cast<double>(cfg_.d_model) * cfg_.seq_len;
}

bool Gpt::is_op_site(std::string_view site) {
  static constexpr std::string_view kTop[] = {"embed/out", "lnf/out", "logits"};
  static constexpr std::string_view kLayer[] = {"ln1/out", "attn/qkv", "attn/att", "attn/res",
                                                "ln2/out", "mlp/fc",   "mlp/act",  "mlp/res"};
  for (auto op : kTop)
    if (site == op) return true;
  if (!site.starts_with("layer/")) return false;
  const size_t slash = site.find('/', 6);
  if (slash == std::string_view::npos || slash == 6) return false;
  for (char ch : site.substr(6, slash - 6))
    if (ch < '0' || ch > '9') return false;
  for (auto op : kLayer)
    if (site.substr(slash + 1) == op) return true;
  return false;
}

Mode Gpt::mode_of(int64_t layer, const char* name) const {
  if (op_modes_.empty()) return mode_;
  const std::string full = (layer >= 0 ? "layer/" + std::to_string(layer) + "/" : "") + name;
  for (const auto& [op, mode] : op_modes_)
    if (op == full) return mode;
  return mode_;
}

void Gpt::observe(const char* prefix, int64_t layer, const char* name, float* data,
                  std::initializer_list<int64_t> shape) const {
  if (!hook_) return;
  std::string full = prefix;
  if (layer >= 0) full += "layer/" + std::to_string(layer) + "/";
  full += name;
  hook_(full, data, std::span<const int64_t>(shape.begin(), shape.size()));
}

GradSink Gpt::sink(const ParamTensor* t) {
  if (t == nullptr) return {};
  if (storage_) return storage_->sink(*t);
  own_grads();
  if (mode_ == Mode::kCanonical) return {nullptr, exact_grads_.get(), t->offset};
  return {grads_.data() + t->offset, nullptr, 0};
}

uint64_t Gpt::grad_bytes() const {
  return grads_.capacity() * sizeof(float) + exact_grads_->size() * (sizeof(double) + 1);
}

void Gpt::set_grad_storage(GradStorage* storage) {
  storage_ = storage;
  if (storage_) {
    std::vector<float>().swap(grads_);
    exact_grads_ = std::make_unique<ExactAccumulator>();
  }
}

void Gpt::own_grads() {
  if (storage_ || !grads_.empty()) return;
  grads_.assign(params_.size(), 0.0f);
  if (mode_ == Mode::kCanonical) exact_grads_->reset(params_.size());
}

float* Gpt::grads() {
  own_grads();
  return grads_.data();
}

ExactAccumulator& Gpt::exact_grads() {
  own_grads();
  return *exact_grads_;
}

namespace {

// f(b, e) over blocks [b, e) of [first, end), split over the OpenMP threads. Zeroing and rounding
// the gradients are memory-bound passes over every parameter (canonical mode: a double and a
// spill flag each, and the fp32 gradient written); on one thread they were a few percent of a
// two-thread step.
template <class F>
void for_param_blocks(int64_t first, int64_t end, const F& f) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t blocks = (end - first + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t b = first + i * kBlock;
    f(static_cast<size_t>(b), static_cast<size_t>(std::min(end, b + kBlock)));
  }
}

}  // namespace

void Gpt::zero_grad() {
  own_grads();
  if (storage_) {
    storage_->zero();
  } else if (mode_ == Mode::kCanonical) {
    for_param_blocks(0, num_params(), [&](size_t b, size_t e) { exact_grads_->zero(b, e); });
  } else {
    for_param_blocks(0, num_params(), [&](size_t b, size_t e) {
      std::fill(grads_.begin() + static_cast<std::ptrdiff_t>(b),
                grads_.begin() + static_cast<std::ptrdiff_t>(e), 0.0f);
    });
  }
}

void Gpt::finish_grads(int64_t first, int64_t end) {
  LS_CHECK(storage_ == nullptr, "finish_grads: the gradients are in a GradStorage, not in the model");
  own_grads();
  if (mode_ != Mode::kCanonical) return;
  for_param_blocks(first, end, [&](size_t b, size_t e) { exact_grads_->round_to(b, e, grads_.data() + b); });
}

void Gpt::norm_forward(Mode mode, int64_t rows, float* out, float* mean, float* rstd,
                       const float* inp, const ParamTensor* w, const ParamTensor* b) {
  const cpu::NormShape s{rows, cfg_.d_model, cfg_.norm_eps};
  if (cfg_.norm == NormKind::kLayerNorm) {
    cpu::layernorm_forward(mode, s, out, mean, rstd, inp, p(w), p(b));
  } else {
    cpu::rmsnorm_forward(mode, s, out, rstd, inp, p(w));
  }
}

void Gpt::norm_backward(int64_t rows, int64_t token_offset, float* dinp, const float* dout,
                        const float* inp, const float* mean, const float* rstd,
                        const ParamTensor* w, const ParamTensor* b) {
  const cpu::NormShape s{rows, cfg_.d_model, cfg_.norm_eps};
  if (cfg_.norm == NormKind::kLayerNorm) {
    cpu::layernorm_backward(mode_, s, token_offset, dinp, sink(w), sink(b), dout, inp, p(w), mean,
                            rstd);
  } else {
    cpu::rmsnorm_backward(mode_, s, token_offset, dinp, sink(w), dout, inp, p(w), rstd);
  }
}

void Gpt::forward(const int32_t* inputs, int64_t B) {
  LS_CHECK(B >= 1 && B <= max_batch_, "micro batch ", B, " exceeds ", max_batch_);
  const int64_t T = cfg_.seq_len, C = cfg_.d_model, BT = B * T, F = local_.F, A = local_.attn;
  const cpu::AttentionShape as{B, T, local_.NH, local_.NKV, cfg_.head_size()};
  const int64_t fc_out = cfg_.ffn == FfnKind::kSwiglu ? 2 * F : F;
  LS_CHECK(!sp_ || BT % tp_->size() == 0, "sequence parallelism: ", BT, " tokens over ", tp_->size(), " ranks");
  // The residual stream's tokens here, as (RB, RT): (B, T), or (1, BT / tp) under sequence parallelism.
  const int64_t RS = residual_tokens(BT), RB = sp_ ? 1 : B, RT = sp_ ? RS : T;

  // Vocabulary-parallel: one rank holds each token's row, the others give -0.0f: an exact sum.
  float* embedded = sp_ ? tp_buf_.data() : encoded_.data();
  cpu::embedding_forward(mode_of(-1, "embed/out"), embedding_shape(B), embedded, inputs, p(wte_), p(wpe_));
  if (sp_) {
    tp_->reduce_scatter_sum(embedded, encoded_.data(), RS * C);
  } else if (tp_) {
    tp_->all_reduce_sum(encoded_.data(), BT * C);
  }
  observe("", -1, "embed/out", encoded_.data(), {RB, RT, C});
  const float* residual = encoded_.data();
  const int64_t NH = local_.NH;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    LayerActs& a = acts_[l];
    const LayerParams& w = layers_[l];
    // x = x + attn(norm1(x))
    norm_forward_gathered(mode_of(l, "ln1/out"), BT, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                          w.ln1_w, w.ln1_b);
    observe("", l, "ln1/out", a.ln1.data(), {B, T, C});
    cpu::linear_forward(mode_of(l, "attn/qkv"), {BT, C, local_.qkv}, a.qkv.data(), a.ln1.data(), p(w.qkv_w),
                        p(w.qkv_b));
    if (cfg_.pos == PosKind::kRope) cpu::rope_forward(as, a.qkv.data(), rope_cos_.data(), rope_sin_.data());
    observe("", l, "attn/qkv", a.qkv.data(), {B, T, local_.qkv});
    cpu::attention_forward(mode_of(l, "attn/att"), as, a.atty.data(), a.att.data(), a.qkv.data());
    observe("", l, "attn/att", a.att.data(), {B, NH, T, T});
    observe("", l, "attn/out", a.atty.data(), {B, T, A});
    linear_forward_row(mode_of(l, "attn/res"), {BT, A, C}, a.res_attn.data(), a.atty.data(), w.proj_w, w.proj_b);
    cpu::residual_forward(RS * C, a.res_attn.data(), a.res_attn.data(), residual);
    observe("", l, "attn/res", a.res_attn.data(), {RB, RT, C});
    // x = x + mlp(norm2(x))
    norm_forward_gathered(mode_of(l, "ln2/out"), BT, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                          a.res_attn.data(), w.ln2_w, w.ln2_b);
    observe("", l, "ln2/out", a.ln2.data(), {B, T, C});
    cpu::linear_forward(mode_of(l, "mlp/fc"), {BT, C, fc_out}, a.fch.data(), a.ln2.data(), p(w.fc_w), p(w.fc_b));
    observe("", l, "mlp/fc", a.fch.data(), {B, T, fc_out});
    if (cfg_.ffn == FfnKind::kGelu) {
      cpu::gelu_forward(mode_of(l, "mlp/act"), BT * F, a.fch_act.data(), a.fch.data());
    } else {
      cpu::swiglu_forward(mode_of(l, "mlp/act"), BT, F, a.fch_act.data(), a.fch.data());
    }
    observe("", l, "mlp/act", a.fch_act.data(), {B, T, F});
    linear_forward_row(mode_of(l, "mlp/res"), {BT, F, C}, a.res_mlp.data(), a.fch_act.data(), w.fcproj_w,
                       w.fcproj_b);
    cpu::residual_forward(RS * C, a.res_mlp.data(), a.res_mlp.data(), a.res_attn.data());
    observe("", l, "mlp/res", a.res_mlp.data(), {RB, RT, C});
    residual = a.res_mlp.data();
  }
  norm_forward_gathered(mode_of(-1, "lnf/out"), BT, lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual, lnf_w_,
                        lnf_b_);
  observe("", -1, "lnf/out", lnf_.data(), {B, T, C});
  cpu::linear_forward(mode_of(-1, "logits"), {BT, C, local_.V}, logits_.data(), lnf_.data(), p(head_), nullptr);
  observe("", -1, "logits", logits_.data(), {B, T, local_.V});
}

// Adds a micro-batch's per-token losses to the running loss sum in canonical chunks of tokens.
static void add_losses(ChunkCombiner& loss_sum, const float* losses, int64_t n) {
  for (int64_t i = 0; i < n; i += kCanonicalChunk) {
    loss_sum.add(chunk_sum(losses + i, 1, std::min(kCanonicalChunk, n - i)));
  }
}

void Gpt::eval_loss(const int32_t* inputs, const int32_t* targets, int64_t B, ChunkCombiner& loss_sum) {
  forward(inputs, B);
  const int64_t BT = B * cfg_.seq_len;
  crossentropy(BT, targets, 0.0f, false);
  observe("", -1, "losses", losses_.data(), {B, cfg_.seq_len});
  add_losses(loss_sum, losses_.data(), BT);
}

void Gpt::forward_backward_batch(const int32_t* inputs, const int32_t* targets, int64_t B,
                                 int64_t MB, int64_t first_token, float dloss, ChunkCombiner& loss_sum) {
  LS_CHECK(MB >= 1 && B % MB == 0, "batch ", B, " is not a multiple of micro-batch ", MB);
  const int64_t T = cfg_.seq_len;
  for (int64_t mb = 0; mb < B / MB; ++mb) {
    last_micro_ = mb == B / MB - 1;
    forward_backward(inputs + mb * MB * T, targets + mb * MB * T, MB, first_token + mb * MB * T,
                     dloss, loss_sum);
  }
  last_micro_ = false;
}

void Gpt::grads_ready(const ParamTensor* first, const ParamTensor* last) {
  if (last == nullptr) last = first;
  if (grad_ready_) grad_ready_(first->offset, last->offset + last->numel, last_micro_);
}

void Gpt::forward_backward(const int32_t* inputs, const int32_t* targets, int64_t B,
                           int64_t token_offset, float dloss, ChunkCombiner& loss_sum) {
  forward(inputs, B);
  const int64_t T = cfg_.seq_len, C = cfg_.d_model, BT = B * T, F = local_.F, A = local_.attn;
  const int64_t V = local_.V;
  const cpu::AttentionShape as{B, T, local_.NH, local_.NKV, cfg_.head_size()};
  const int64_t fc_out = cfg_.ffn == FfnKind::kSwiglu ? 2 * F : F;
  // The residual stream's tokens here (see forward) and the global index of the first of them.
  const int64_t RS = residual_tokens(BT), RB = sp_ ? 1 : B, RT = sp_ ? RS : T;
  const int64_t residual_offset = token_offset + residual_first(BT);

  // Loss and dlogits (in place over the logits).
  crossentropy(BT, targets, dloss, true);
  observe("", -1, "losses", losses_.data(), {B, T});
  observe("grad/", -1, "logits", logits_.data(), {B, T, V});
  add_losses(loss_sum, losses_.data(), BT);

  // Head and final norm. dres_ carries d(residual stream), which the norms' backward accumulate
  // into (+=); the linears' input gradients overwrite their outputs.
  linear_backward_column({BT, C, V}, token_offset, dbuf_c_.data(), sink(head_), {}, logits_.data(),
                         lnf_.data(), head_);
  if (head_ != wte_) grads_ready(head_);
  observe("grad/", -1, "lnf/out", dbuf_c_.data(), {RB, RT, C});
  std::fill_n(dres_.begin(), RS * C, 0.0f);
  const float* last = cfg_.n_layers > 0 ? acts_.back().res_mlp.data() : encoded_.data();
  norm_backward(RS, residual_offset, dres_.data(), dbuf_c_.data(), last, lnf_mean_.data(),
                lnf_rstd_.data(), lnf_w_, lnf_b_);
  grads_ready(lnf_w_, lnf_b_);

  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    LayerActs& a = acts_[l];
    const LayerParams& w = layers_[l];
    const float* residual_in = l == 0 ? encoded_.data() : acts_[l - 1].res_mlp.data();
    observe("grad/", l, "mlp/res", dres_.data(), {RB, RT, C});
    // MLP: x2 = x1 + proj(act(fc(norm2(x1))))
    cpu::linear_backward(mode_, {BT, F, C}, token_offset, dfch_act_.data(), sink(w.fcproj_w),
                         sink(w.fcproj_b), gathered_dres(BT), a.fch_act.data(), p(w.fcproj_w));
    grads_ready(w.fcproj_w, w.fcproj_b);
    observe("grad/", l, "mlp/act", dfch_act_.data(), {B, T, F});
    if (cfg_.ffn == FfnKind::kGelu) {
      cpu::gelu_backward(mode_, BT * F, dfch_.data(), a.fch.data(), dfch_act_.data());
    } else {
      cpu::swiglu_backward(mode_, BT, F, dfch_.data(), a.fch.data(), dfch_act_.data());
    }
    observe("grad/", l, "mlp/fc", dfch_.data(), {B, T, fc_out});
    linear_backward_column({BT, C, fc_out}, token_offset, dbuf_c_.data(), sink(w.fc_w), sink(w.fc_b),
                           dfch_.data(), a.ln2.data(), w.fc_w);
    grads_ready(w.fc_w, w.fc_b);
    observe("grad/", l, "ln2/out", dbuf_c_.data(), {RB, RT, C});
    norm_backward(RS, residual_offset, dres_.data(), dbuf_c_.data(), a.res_attn.data(),
                  a.ln2_mean.data(), a.ln2_rstd.data(), w.ln2_w, w.ln2_b);
    grads_ready(w.ln2_w, w.ln2_b);
    observe("grad/", l, "attn/res", dres_.data(), {RB, RT, C});
    // Attention: x1 = x0 + proj(attn(rope(qkv(norm1(x0)))))
    cpu::linear_backward(mode_, {BT, A, C}, token_offset, datty_.data(), sink(w.proj_w),
                         sink(w.proj_b), gathered_dres(BT), a.atty.data(), p(w.proj_w));
    grads_ready(w.proj_w, w.proj_b);
    observe("grad/", l, "attn/out", datty_.data(), {B, T, A});
    cpu::attention_backward(mode_, as, dqkv_.data(), datt_.data(), datty_.data(), a.qkv.data(),
                            a.att.data());
    observe("grad/", l, "attn/qkv", dqkv_.data(), {B, T, local_.qkv});
    if (cfg_.pos == PosKind::kRope) cpu::rope_backward(as, dqkv_.data(), rope_cos_.data(), rope_sin_.data());
    linear_backward_column({BT, C, local_.qkv}, token_offset, dbuf_c_.data(), sink(w.qkv_w), sink(w.qkv_b),
                           dqkv_.data(), a.ln1.data(), w.qkv_w);
    grads_ready(w.qkv_w, w.qkv_b);
    observe("grad/", l, "ln1/out", dbuf_c_.data(), {RB, RT, C});
    norm_backward(RS, residual_offset, dres_.data(), dbuf_c_.data(), residual_in, a.ln1_mean.data(),
                  a.ln1_rstd.data(), w.ln1_w, w.ln1_b);
    grads_ready(w.ln1_w, w.ln1_b);
  }
  observe("grad/", -1, "embed/out", dres_.data(), {RB, RT, C});
  // The embedding's gradients from all the tokens (the conjugate of its reduce-scatter).
  cpu::embedding_backward(mode_, embedding_shape(B), token_offset, sink(wte_), sink(wpe_), gathered_dres(BT),
                          inputs);
  grads_ready(wte_, wpe_);
}

}  // namespace lockstep
