// The step's ops by tensor name (op_graph.hpp), read off the layers' declarations.
#include "verify/op_graph.hpp"

namespace lockstep::verify {

OpInputs op_inputs(const std::string& name, const ModelDesc& desc) {
  if (name.starts_with("grad/param/")) {
    return {"parameter gradient, accumulated over the micro-batches and reduced", {},
            "the activations and activation gradients above"};
  }
  if (name.starts_with("param/")) {
    return {"clip + AdamW update", {"grad/" + name}, "the parameter and AdamW moments before the step"};
  }
  if (const OpDecl* op = find_op(desc, name)) return {op->op, op->inputs, op->other};
  return {"unknown", {}, ""};
}

}  // namespace lockstep::verify
