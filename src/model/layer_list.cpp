// GPT's layer list and the lookups over it (see layer_list.hpp).
#include "src/model/layer_list.hpp"

#include <cmath>
#include <set>

#include "src/core/check.hpp"
#include "src/model/layers/registry.hpp"

namespace lockstep {

std::string_view layer_kind_name(LayerKind k) { return layer_type(k).name; }

std::string_view param_class_name(ParamClass c) {
  switch (c) {
    case ParamClass::kMatrix: return "matrices";
    case ParamClass::kEmbedding: return "embeddings";
    case ParamClass::kNorm: return "norms";
    case ParamClass::kBias: return "biases";
  }
  return "?";
}

int64_t ModelDesc::n_blocks() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.kind == LayerKind::kAttention ? 1 : 0;
  return n;
}

ModelDesc describe_model(const ModelConfig& cfg) {
  cfg.validate();
  ModelDesc desc;
  desc.config = cfg;
  LayerDesc base;
  base.dims = {cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size(), cfg.ffn_width()};
  base.norm = cfg.norm;
  base.norm_eps = cfg.norm_eps;
  base.ffn = cfg.ffn;
  base.bias = cfg.bias;
  base.pos = cfg.pos;
  base.rope_theta = cfg.rope_theta;
  base.tied = cfg.tie_embeddings;
  // GPT-2: projections into the residual stream are scaled down by 1/sqrt(2L).
  base.residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(cfg.n_layers));
  auto add = [&](LayerKind kind, int64_t block) {
    LayerDesc d = base;
    d.kind = kind;
    d.block = block;
    if (block >= 0) d.prefix = "layer/" + std::to_string(block) + "/";
    desc.layers.push_back(std::move(d));
  };
  add(LayerKind::kEmbedding, -1);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    add(LayerKind::kAttention, l);
    if (!cfg.moe_block(l)) {
      add(LayerKind::kMlp, l);
      continue;
    }
    add(LayerKind::kMoe, l);
    LayerDesc& moe = desc.layers.back();
    moe.dims.F = cfg.moe_ffn_width();
    moe.experts = cfg.moe_experts;
    moe.top_k = cfg.moe_top_k;
    moe.router = cfg.moe_router;
    moe.normalize_gates = cfg.moe_normalize;
    moe.capacity_factor = cfg.moe_capacity_factor;
    moe.aux_weight = cfg.moe_aux_weight;
    moe.selection_bias = cfg.moe_bias_update > 0;
    moe.shared_F = cfg.moe_shared_experts * cfg.moe_ffn_width();
  }
  add(LayerKind::kFinalNorm, -1);
  add(LayerKind::kHead, -1);
  declare_layers(desc);
  return desc;
}

void declare_layers(ModelDesc& desc) {
  std::set<std::string> names;
  for (size_t i = 0; i < desc.layers.size(); ++i) {
    LayerDesc& d = desc.layers[i];
    d.input = i == 0 ? std::string() : desc.layers[i - 1].output;
    d.params.clear();
    d.hooks.clear();
    d.ops.clear();
    layer_type(d.kind).declare(d);
    for (const auto& p : d.params) {
      LS_CHECK(names.insert(p.name).second, "two layers declare the parameter ", p.name);
    }
    for (const auto& h : d.hooks) {
      LS_CHECK(names.insert(h.name).second, "two layers declare the tensor ", h.name);
    }
  }
}

std::vector<const ParamDecl*> model_params(const ModelDesc& desc) {
  std::vector<const ParamDecl*> out;
  for (const auto& l : desc.layers)
    for (const auto& p : l.params) out.push_back(&p);
  return out;
}

const HookDecl* find_hook(const ModelDesc& desc, std::string_view name) {
  if (name.starts_with("grad/")) name.remove_prefix(5);
  for (const auto& l : desc.layers)
    for (const auto& h : l.hooks)
      if (h.name == name) return &h;
  return nullptr;
}

const OpDecl* find_op(const ModelDesc& desc, std::string_view tensor) {
  for (const auto& l : desc.layers)
    for (const auto& o : l.ops)
      if (o.tensor == tensor) return &o;
  return nullptr;
}

bool is_op_site(const ModelDesc& desc, std::string_view site) {
  const HookDecl* h = site.starts_with("grad/") ? nullptr : find_hook(desc, site);
  return h != nullptr && h->op_site;
}

std::string op_sites_text(const ModelDesc& desc) {
  std::string text;
  std::set<std::string> seen;
  for (const auto& l : desc.layers) {
    for (const auto& h : l.hooks) {
      if (!h.op_site) continue;
      const std::string shown = l.block >= 0 ? "layer/N/" + h.name.substr(l.prefix.size()) : h.name;
      if (!seen.insert(shown).second) continue;
      text += (text.empty() ? "" : ", ") + shown;
    }
  }
  return text;
}

int64_t ffn_fc_width(const LayerDesc& layer, int64_t F) { return layer.ffn == FfnKind::kSwiglu ? 2 * F : F; }

std::vector<int64_t> ffn_fc_segments(const LayerDesc& layer, int64_t F) {
  return layer.ffn == FfnKind::kSwiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F};
}

int64_t param_numel(const ParamDecl& p) {
  int64_t n = 1;
  for (int64_t s : p.shape) n *= s;
  return n;
}

double layer_flops_per_token(const LayerDesc& l) {
  double matmul_params = 0;
  for (const auto& p : l.params) {
    if (p.matmul) matmul_params += static_cast<double>(param_numel(p)) * p.token_share;
  }
  return 6.0 * matmul_params + l.activation_flops;
}

double flops_per_token(const ModelDesc& desc) {
  double total = 0;
  for (const auto& l : desc.layers) total += layer_flops_per_token(l);
  return total;
}

}  // namespace lockstep
