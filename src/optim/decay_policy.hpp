// Which parameters AdamW's weight decay applies to, by class (src/model/layer_list.hpp). The
// default decays matrices and embeddings and leaves norms and biases alone, as GPT-2, Megatron and
// llm.c do: decaying a norm's gain towards 0 or a bias towards 0 is not a regularizer of the
// function's complexity, only a pull on its scale and offset.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "src/model/layer_list.hpp"

namespace lockstep {

struct DecayPolicy {
  std::array<bool, kNumParamClasses> classes{true, true, false, false};  // by ParamClass

  bool decays(ParamClass c) const { return classes[static_cast<size_t>(c)]; }

  // Comma-separated class names (param_class_name: "matrices,embeddings,norms,biases"), "none"
  // or "" for no tensor. An unknown or repeated name is a ConfigError naming `where`.
  static DecayPolicy parse(std::string_view list, const std::string& where);
};

}  // namespace lockstep
