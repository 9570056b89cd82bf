#include "src/model/config.hpp"

#include "src/core/check.hpp"

namespace lockstep {

int64_t ModelConfig::ffn_width() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (ffn == FfnKind::kGelu) return 4 * d_model;
  const int64_t f = (8 * d_model) / 3;  // keeps parameters equal to a 4·C GELU MLP
  return (f + 63) / 64 * 64;
}

int64_t ModelConfig::moe_ffn_width() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_width(); }

void ModelConfig::validate() const {
  // Token files hold uint16 ids (src/data/token_file.hpp); the model's ids are int32, so a larger
  // vocabulary (Llama 3's 128,256, for the planner) is a model, whose ids above 65535 no file feeds.
  LS_REQUIRE(vocab_size >= 2 && vocab_size <= INT32_MAX, "[model] vocab_size (", vocab_size,
             ") must be in [2, 2^31 - 1]: token ids are int32");
  LS_REQUIRE(seq_len >= 1, "[model] seq_len (", seq_len, ") must be >= 1");
  LS_REQUIRE(d_model >= 1 && n_layers >= 1 && n_heads >= 1 && n_kv_heads >= 1,
             "[model] d_model, n_layers, n_heads and n_kv_heads must be >= 1");
  LS_REQUIRE(d_model % n_heads == 0, "[model] d_model (", d_model,
             ") must be divisible by n_heads (", n_heads, ")");
  LS_REQUIRE(n_heads % n_kv_heads == 0, "[model] n_heads (", n_heads,
             ") must be divisible by n_kv_heads (", n_kv_heads, ")");
  LS_REQUIRE(pos != PosKind::kRope || head_size() % 2 == 0, "[model] pos = \"rope\" needs an even head size, got d_model/n_heads = ",
             head_size());
  LS_REQUIRE(ffn_hidden >= 0, "[model] ffn_hidden (", ffn_hidden, ") must be >= 0 (0 = default)");
  LS_REQUIRE(norm_eps > 0, "[model] norm_eps (", norm_eps, ") must be > 0");
  LS_REQUIRE(init_std > 0, "[model] init_std (", init_std, ") must be > 0");
  LS_REQUIRE(rope_theta > 1, "[model] rope_theta (", rope_theta, ") must be > 1");
  LS_REQUIRE(moe_experts >= 0, "[model] moe_experts (", moe_experts, ") must be >= 0 (0 = dense)");
  if (moe_experts == 0) return;
  LS_REQUIRE(moe_top_k >= 1 && moe_top_k <= moe_experts, "[model] moe_top_k (", moe_top_k,
             ") must be in [1, moe_experts = ", moe_experts, "]: each token chooses that many of the experts");
  LS_REQUIRE(moe_every >= 1, "[model] moe_every (", moe_every, ") must be >= 1");
  LS_REQUIRE(moe_ffn_hidden >= 0, "[model] moe_ffn_hidden (", moe_ffn_hidden, ") must be >= 0 (0 = ffn_hidden)");
  LS_REQUIRE(moe_capacity_factor >= 0, "[model] moe_capacity_factor (", moe_capacity_factor, ") must be >= 0 (0 = dropless)");
  LS_REQUIRE(moe_aux_weight >= 0, "[model] moe_aux_weight (", moe_aux_weight, ") must be >= 0");
  LS_REQUIRE(moe_shared_experts >= 0, "[model] moe_shared_experts (", moe_shared_experts, ") must be >= 0");
  LS_REQUIRE(moe_bias_update >= 0, "[model] moe_bias_update (", moe_bias_update, ") must be >= 0 (0 = no bias)");
}

std::string ffn_name(FfnKind k) { return k == FfnKind::kGelu ? "gelu" : "swiglu"; }
std::string norm_name(NormKind k) { return k == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }
std::string pos_name(PosKind k) { return k == PosKind::kLearned ? "learned" : "rope"; }

FfnKind ffn_from_name(const std::string& s) {
  if (s == "gelu") return FfnKind::kGelu;
  if (s == "swiglu") return FfnKind::kSwiglu;
  throw ConfigError(str_cat("[model] ffn: expected \"gelu\" or \"swiglu\", got \"", s, "\""));
}
NormKind norm_from_name(const std::string& s) {
  if (s == "layernorm") return NormKind::kLayerNorm;
  if (s == "rmsnorm") return NormKind::kRmsNorm;
  throw ConfigError(str_cat("[model] norm: expected \"layernorm\" or \"rmsnorm\", got \"", s, "\""));
}
PosKind pos_from_name(const std::string& s) {
  if (s == "learned") return PosKind::kLearned;
  if (s == "rope") return PosKind::kRope;
  throw ConfigError(str_cat("[model] pos: expected \"learned\" or \"rope\", got \"", s, "\""));
}

std::string router_name(RouterKind k) { return k == RouterKind::kSoftmax ? "softmax" : "sigmoid"; }
RouterKind router_from_name(const std::string& s) {
  if (s == "softmax") return RouterKind::kSoftmax;
  if (s == "sigmoid") return RouterKind::kSigmoid;
  throw ConfigError(str_cat("[model] moe_router: expected \"softmax\" or \"sigmoid\", got \"", s, "\""));
}

}  // namespace lockstep
