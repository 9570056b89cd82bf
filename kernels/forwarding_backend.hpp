// A Backend that hands every op to another one: the base of backends that watch some ops of a run
// (the GEMM checksums of verify/detect/abft.hpp) — they override the ops they watch, call the
// inner backend's and look at what it produced, and leave the others as they are. The results are
// the inner backend's, bit for bit.
#pragma once

#include <string>

#include "kernels/backend.hpp"

namespace lockstep {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  Backend& inner() const { return inner_; }
  std::string describe(Mode mode) const override { return inner_.describe(mode); }
  bool rounds_bf16_as_read(Mode mode) const override { return inner_.rounds_bf16_as_read(mode); }

#define LS_OP(name, params, args) \
  void name params override { inner_.name args; }
#include "kernels/ops/ops.def"
#undef LS_OP

 private:
  Backend& inner_;
};

}  // namespace lockstep
