// GPT model configuration: the [model] section of a run config, validated at construction.
//
// A GPT-2/Llama-style decoder: token embedding, optional learned positions (or RoPE inside
// attention), L pre-norm blocks of causal self-attention with grouped KV heads and an MLP
// (GELU tanh form, or SwiGLU), a final norm and a language-model head (optionally tied to the
// token embedding). Not here: parallel layout (src/parallel), numerics mode (train config).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

enum class FfnKind : uint8_t { kGelu, kSwiglu };
enum class NormKind : uint8_t { kLayerNorm, kRmsNorm };
enum class PosKind : uint8_t { kLearned, kRope };
enum class RouterKind : uint8_t { kSoftmax, kSigmoid };

struct ModelConfig {
  int64_t vocab_size = 257;
  int64_t seq_len = 128;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;
  int64_t ffn_hidden = 0;  // 0: 4·d_model (GELU) or the Llama rule 8/3·d_model rounded to 64 (SwiGLU)
  FfnKind ffn = FfnKind::kGelu;
  NormKind norm = NormKind::kLayerNorm;
  PosKind pos = PosKind::kLearned;
  bool tie_embeddings = true;
  bool bias = true;
  float norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  float init_std = 0.02f;
  uint64_t seed = 1234;
  // Mixture of experts (0 experts: dense). Block l's MLP is a MoE layer where l % moe_every == 0
  // (Megatron's layer frequency); its experts are MLPs of moe_ffn_hidden features (0: F).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  int64_t moe_every = 1;
  int64_t moe_ffn_hidden = 0;
  RouterKind moe_router = RouterKind::kSoftmax;
  bool moe_normalize = true;         // the chosen experts' gates renormalised to sum to 1
  double moe_capacity_factor = 0;    // 0: dropless; else each expert takes at most
                                     // ceil(factor · T · top_k / experts) tokens of a sequence
  float moe_aux_weight = 0.01f;      // the load-balancing loss's weight (0: none)
  int64_t moe_shared_experts = 0;    // experts every token uses besides its top_k (DeepSeek): one
                                     // MLP of moe_shared_experts x moe_ffn_hidden features
  float moe_bias_update = 0;         // aux-loss-free balancing (DeepSeek-V3): after each step an
                                     // expert's selection bias moves by this towards the mean load
                                     // (0: no bias)

  int64_t head_size() const { return d_model / n_heads; }
  int64_t qkv_width() const { return (n_heads + 2 * n_kv_heads) * head_size(); }
  int64_t ffn_width() const;  // F, the resolved ffn_hidden
  int64_t moe_ffn_width() const;  // an expert's F
  bool moe_block(int64_t block) const { return moe_experts > 0 && block % moe_every == 0; }
  // Throws ConfigError naming the field and the constraint when the shape is inconsistent.
  void validate() const;
};

std::string ffn_name(FfnKind k);
std::string norm_name(NormKind k);
std::string pos_name(PosKind k);
FfnKind ffn_from_name(const std::string& s);   // ConfigError on anything else
NormKind norm_from_name(const std::string& s);
PosKind pos_from_name(const std::string& s);
std::string router_name(RouterKind k);
RouterKind router_from_name(const std::string& s);

}  // namespace lockstep
