// Which tensors each dumped tensor is computed from: the op behind every hook name of the step, as
// the model's layers declare it (src/model/layer_list.hpp's OpDecl), so that bisect can show that
// the op it names had agreeing inputs. Names are hook names without the `step/N/` prefix.
// Not here: the values (diff.hpp) or bounds (op_bounds.hpp).
#pragma once

#include <string>
#include <vector>

#include "src/model/layer_list.hpp"

namespace lockstep::verify {

struct OpInputs {
  std::string op;                    // what computes the tensor, e.g. "linear (qkv) + RoPE"
  std::vector<std::string> tensors;  // hook-name inputs (dumped, compared)
  std::string other;                 // inputs that are not hook tensors: parameters, tokens, targets
};

// The op producing tensor `name` (a hook name, `loss`, `grad/param/...` or `param/...`) in the
// model `desc`. Unknown names give an op "unknown" with no inputs.
OpInputs op_inputs(const std::string& name, const ModelDesc& desc);

}  // namespace lockstep::verify
