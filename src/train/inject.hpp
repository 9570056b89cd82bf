// Divergence and fault injection for tests and demos of `lockstep diff` / `lockstep bisect`:
// one planted change at one step and one site of the model, chosen by name on the command line,
//
//   --inject.site=layer/2/mlp/res --inject.step=7 --inject.kind=bitflip:bit=27[,index=N]
//   --inject.site=layer/1/attn/att --inject.step=7 --inject.kind=order
//   --inject.site=layer/3/mlp/fc --inject.step=7 --inject.kind=cast:bf16
//
// bitflip: flips one bit of one element of the tensor (the first micro-batch's), as silent data
//   corruption would;
// order:   runs that op's forward in the other mode (canonical <-> fast): a different but valid
//   accumulation order, the kind of change a new kernel or library brings;
// cast:F:  rounds every element of the tensor to F (bf16, f16, e4m3, e5m2) and back, as running
//   that op in a narrower format would.
// Sites are the model's hook names (src/model/layer.hpp); `grad/...` sites act on the backward.
// --inject.rank=R restricts the injection to world rank R (silent corruption on one device); by
// default every rank injects at its own micro-batches. Under tensor parallelism a rank's tensor is
// its shard (src/model/hook_layout.hpp says where it lies in the global one): bitflip's index is
// an element of that shard.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/model.hpp"
#include "src/train/config.hpp"

namespace lockstep {

struct Injection {
  enum class Kind { kNone, kBitflip, kOrder, kCast };
  Kind kind = Kind::kNone;
  std::string site;
  int64_t step = 0;
  int64_t rank = -1;    // world rank that injects (-1: every rank)
  int bit = 0;          // bitflip
  int64_t index = 0;    // bitflip: element of the tensor
  std::string format;   // cast
};

// Parses and checks the [inject] section of a run of `model`; `where` names the config for messages.
Injection parse_injection(const InjectConfig& c, const std::string& where, const ModelConfig& model);

// Applies an Injection to a model step by step. The trainer calls begin_step() before each step's
// forward/backward, on_tensor() from the model's hook, and end_step() after it; end_step() of the
// injection step fails if the site never appeared (a misspelt name must not pass silently).
class Injector {
 public:
  // world_rank: this process's rank; an injection restricted to another rank does nothing here.
  Injector(Injection injection, int64_t world_rank)
      : inj_(std::move(injection)), here_(inj_.rank < 0 || inj_.rank == world_rank) {}

  bool active() const { return inj_.kind != Injection::Kind::kNone && here_; }
  void begin_step(Model& model, int64_t step);
  void on_tensor(std::string_view name, float* data, std::span<const int64_t> shape);
  void end_step(Model& model);

 private:
  Injection inj_;
  bool here_ = true;      // this rank injects
  bool now_ = false;      // this step is the injection step
  bool applied_ = false;  // the site was seen (bitflip: already flipped)
};

}  // namespace lockstep
