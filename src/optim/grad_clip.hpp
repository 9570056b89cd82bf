// Global-norm gradient clipping: the one rule and the one implementation every layout uses (one
// process; ZeRO 0, 1 and 2; tensor parallelism). The norm is the square root of the gradient's sum
// of squares — canonical: each tensor's chunked exact sum, combined exactly over tensors and ranks
// and rounded once, then an fp32 sqrt — and a norm above the limit scales every element by
// max_norm / (norm + 1e-6). A NaN norm leaves the gradient unscaled (the step reports the norm);
// an infinite one scales it by 0.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "src/model/model.hpp"

namespace lockstep {

// The factor the gradient of global norm `norm` is scaled by, or none when it is not clipped:
// max_norm = 0 (off), norm <= max_norm, or a NaN norm.
std::optional<float> clip_scale(float norm, float max_norm);

// What of the model's flat gradient buffer one process holds and counts towards the global norm.
struct GradPart {
  int64_t first = 0, end = 0;    // elements [first, end) of the flat buffer
  float* grads = nullptr;        // the gradient of element `first`
  bool skip_replicated = false;  // tensors not split by tp: counted by tp rank 0 only
  bool skip_shared = false;      // tensors not split by ep (not a routed expert's): counted by ep rank 0 only
};

// Sum of squares of the part, tensor piece by tensor piece, `total` of it over the processes that
// share the gradient (the sum of every process's part; on one process the part's own), the norm,
// and the part clipped in place. Returns the norm before clipping.
float clip_grad_norm(const Model& model, const GradPart& part, float max_norm,
                     const std::function<float(const ChunkCombiner&)>& total);

// One process holding the whole gradient.
float clip_grad_norm(Model& model, float max_norm);

}  // namespace lockstep
