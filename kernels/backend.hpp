// The kernels as the model reaches them: a Backend runs every op of kernels/ops/ops.def (the
// signatures and contracts of kernels/ops) on one kind of device, and owns the choices that decide
// how — on the CPU the instruction set, fast mode's GEMM and the threads (kernels/cpu/cpu_backend.hpp);
// on a GPU, later, the device and its libraries. Model code calls ops through it and never names a
// device's kernels.
// Not here: the ops' contracts (kernels/ops), any one device's implementation.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/ops/activation.hpp"
#include "kernels/ops/attention.hpp"
#include "kernels/ops/cast.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/crossentropy.hpp"
#include "kernels/ops/embedding.hpp"
#include "kernels/ops/linear.hpp"
#include "kernels/ops/mode.hpp"
#include "kernels/ops/moe.hpp"
#include "kernels/ops/norm.hpp"
#include "kernels/ops/optim.hpp"
#include "kernels/ops/quantize.hpp"
#include "kernels/ops/residual.hpp"
#include "kernels/ops/rope.hpp"

namespace lockstep {

class Backend {
 public:
  virtual ~Backend() = default;
  // What runs the ops in `mode`, for logs: e.g. "avx512" or "avx512 (fast mode's GEMM OpenBLAS
  // sgemm (SkylakeX))".
  virtual std::string describe(Mode mode) const = 0;
  // Whether `mode`'s bf16 linears read an fp32 operand rounded to bf16 (LinearShape::round_dout,
  // round_weight) as their products pack it, with no rounded copy: where they do, the model keeps
  // no bf16 copy of its weights up to date.
  virtual bool rounds_bf16_as_read(Mode mode) const = 0;

#define LS_OP(name, params, args) virtual void name params = 0;
#include "kernels/ops/ops.def"
#undef LS_OP
};

// The backend a model built without one uses: this build's CPU backend with the process's settings
// as they are (kernels/cpu/cpu_backend.hpp).
Backend& process_backend();

}  // namespace lockstep
