// Which tensors each dumped tensor is computed from: the op behind every hook name of the GPT step
// (src/model/gpt.cpp's forward and backward, written out), so that bisect can show that the op it
// names had agreeing inputs. Names are hook names without the `step/N/` prefix.
// Not here: the values (diff.hpp) or bounds (op_bounds.hpp).
#pragma once

#include <string>
#include <vector>

namespace lockstep::verify {

struct OpInputs {
  std::string op;                  // what computes the tensor, e.g. "linear (attn qkv) + RoPE"
  std::vector<std::string> tensors;  // hook-name inputs (dumped, compared)
  std::string other;               // inputs that are not hook tensors: parameters, tokens, targets
};

// The op producing hook tensor `name` in a model of `n_layers` layers. Unknown names give an op
// "unknown" with no inputs.
OpInputs op_inputs(const std::string& name, int64_t n_layers);

}  // namespace lockstep::verify
