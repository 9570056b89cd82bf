// The GPT step's ops by hook name (op_graph.hpp), read off src/model/gpt.cpp.
#include "verify/op_graph.hpp"

#include <cstdint>
#include <regex>

namespace lockstep::verify {

OpInputs op_inputs(const std::string& name, int64_t n_layers) {
  auto layer = [](int64_t l, const std::string& t) { return "layer/" + std::to_string(l) + "/" + t; };
  // The residual stream entering layer l, and the one leaving the last layer.
  auto stream_in = [&](int64_t l) { return l == 0 ? std::string("embed/out") : layer(l - 1, "mlp/res"); };
  const std::string last = n_layers > 0 ? layer(n_layers - 1, "mlp/res") : "embed/out";
  const std::string tokens = "tokens of the step's batch (data; equal when the sampler state is)";

  if (name == "embed/out") return {"embedding", {}, "wte, wpe; " + tokens};
  if (name == "lnf/out") return {"final norm", {last}, "lnf weights"};
  if (name == "logits") return {"linear (head)", {"lnf/out"}, "head (wte when tied)"};
  if (name == "losses") return {"cross-entropy", {"logits"}, "targets"};
  if (name == "loss") return {"mean of the per-token losses over the batch", {"losses"}, ""};
  if (name == "grad/logits") return {"cross-entropy backward", {"logits"}, "targets"};
  if (name == "grad/lnf/out") return {"linear backward (head, input gradient)", {"grad/logits"}, "head"};
  if (name == "grad/embed/out") {
    return {"norm backward (layer 0 ln1) + residual", {"grad/layer/0/ln1/out", "embed/out", "grad/layer/0/attn/res"},
            "layer 0 ln1 weights"};
  }
  if (name.rfind("grad/param/", 0) == 0) {
    return {"parameter gradient, accumulated over the micro-batches and reduced", {},
            "the activations and activation gradients above"};
  }
  if (name.rfind("param/", 0) == 0) {
    return {"clip + AdamW update", {"grad/" + name}, "the parameter and AdamW moments before the step"};
  }

  static const std::regex kLayer(R"(^(grad/)?layer/(\d+)/(.+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, kLayer)) return {"unknown", {}, ""};
  const bool grad = m[1].matched;
  const int64_t l = std::stoll(m[2].str());
  const std::string t = m[3].str();
  if (!grad) {
    if (t == "ln1/out") return {"norm (ln1)", {stream_in(l)}, "ln1 weights"};
    if (t == "attn/qkv") return {"linear (qkv) + RoPE", {layer(l, "ln1/out")}, "qkv weight and bias"};
    if (t == "attn/att") return {"attention (scores, softmax)", {layer(l, "attn/qkv")}, ""};
    if (t == "attn/out") return {"attention (weighted values)", {layer(l, "attn/qkv")}, ""};
    if (t == "attn/res") {
      return {"linear (attn proj) + residual", {layer(l, "attn/out"), stream_in(l)}, "proj weight and bias"};
    }
    if (t == "ln2/out") return {"norm (ln2)", {layer(l, "attn/res")}, "ln2 weights"};
    if (t == "mlp/fc") return {"linear (mlp fc)", {layer(l, "ln2/out")}, "fc weight and bias"};
    if (t == "mlp/act") return {"activation", {layer(l, "mlp/fc")}, ""};
    if (t == "mlp/res") {
      return {"linear (mlp proj) + residual", {layer(l, "mlp/act"), layer(l, "attn/res")},
              "mlp proj weight and bias"};
    }
    return {"unknown", {}, ""};
  }
  const std::string g = "grad/";
  if (t == "mlp/res") {
    if (l == n_layers - 1) return {"final norm backward", {"grad/lnf/out", last}, "lnf weights"};
    return {"norm backward (ln1 of the next layer) + residual",
            {g + layer(l + 1, "ln1/out"), layer(l, "mlp/res"), g + layer(l + 1, "attn/res")},
            "ln1 weights of the next layer"};
  }
  if (t == "mlp/act") return {"linear backward (mlp proj, input gradient)", {g + layer(l, "mlp/res")}, "mlp proj weight"};
  if (t == "mlp/fc") return {"activation backward", {g + layer(l, "mlp/act"), layer(l, "mlp/fc")}, ""};
  if (t == "ln2/out") return {"linear backward (mlp fc, input gradient)", {g + layer(l, "mlp/fc")}, "fc weight"};
  if (t == "attn/res") {
    return {"norm backward (ln2) + residual", {g + layer(l, "ln2/out"), layer(l, "attn/res"), g + layer(l, "mlp/res")},
            "ln2 weights"};
  }
  if (t == "attn/out") return {"linear backward (attn proj, input gradient)", {g + layer(l, "attn/res")}, "proj weight"};
  if (t == "attn/qkv") {
    return {"attention backward", {g + layer(l, "attn/out"), layer(l, "attn/qkv"), layer(l, "attn/att")}, ""};
  }
  if (t == "ln1/out") {
    return {"RoPE backward + linear backward (qkv, input gradient)", {g + layer(l, "attn/qkv")}, "qkv weight"};
  }
  return {"unknown", {}, ""};
}

}  // namespace lockstep::verify
