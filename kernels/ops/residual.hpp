// The residual stream's add: out = a + b, elementwise (out may alias a or b). One fp32 add per
// element in both modes; no reduction. Its backward is the identity on both operands, which the
// layers apply by updating the stream's gradient in place (src/model/layer.hpp).
#pragma once

#include <cstdint>

namespace lockstep::cpu {

void residual_forward(int64_t n,
                      float* out,                                 // (n)
                      const float* a, const float* b);            // (n) (n)

}  // namespace lockstep::cpu
