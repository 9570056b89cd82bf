// `lockstep ckpt info DIR`: load and verify a checkpoint, print what it holds and its model hash.
// DIR is a checkpoint (step_* directory) or a checkpoint root, meaning its newest valid checkpoint.
// This command only reads; it does not repair, convert or delete checkpoints.
#include <algorithm>
#include <iomanip>
#include <iostream>

#include "src/ckpt/checkpoint.hpp"
#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kCkptUsage =
    "usage: lockstep ckpt info DIR\n"
    "  DIR: a checkpoint directory (step_XXXXXXXX) or a checkpoint root (its newest valid one)\n"
    "  prints step, layout, one line per tensor (name dtype shape xxh64), then `model hash H`\n";

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

ckpt::Checkpoint load_dir_or_root(const std::string& dir) {
  if (!ckpt::list_checkpoints(dir).empty()) {
    auto latest = ckpt::load_latest(dir, std::cerr);
    if (!latest) throw DataError(str_cat(dir, ": no checkpoint under this root loads (see warnings)"));
    return std::move(*latest);
  }
  return ckpt::load(dir);
}

void print_info(const ckpt::Checkpoint& c, std::ostream& out) {
  out << "checkpoint " << c.dir << "\n";
  out << "step " << c.step << "\n";
  out << "layout";
  for (const auto& [axis, size] : c.manifest["layout"].items()) out << " " << axis << "=" << size.dump();
  out << "\n";
  size_t name_width = 0, dtype_width = 0, shape_width = 0;
  uint64_t total = 0;
  for (const auto& t : c.tensors) {
    name_width = std::max(name_width, t.name.size());
    dtype_width = std::max(dtype_width, dtype_name(t.dtype).size());
    shape_width = std::max(shape_width, shape_str(t.shape).size());
    total += t.bytes.size();
  }
  out << "tensors " << c.tensors.size() << " (" << total << " bytes)\n";
  for (const auto& t : c.tensors) {
    out << "  " << std::left << std::setw(static_cast<int>(name_width)) << t.name << "  "
        << std::setw(static_cast<int>(dtype_width)) << dtype_name(t.dtype) << "  "
        << std::setw(static_cast<int>(shape_width)) << shape_str(t.shape) << "  " << hex64(t.xxh64)
        << "\n";
  }
  out << "model hash " << hex64(ckpt::model_hash(c)) << "\n";
}

}  // namespace

int cmd_ckpt(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kCkptUsage;
    return 0;
  }
  const auto& pos = args.positionals();
  LS_REQUIRE(!pos.empty(), "lockstep ckpt: missing verb (usage: lockstep ckpt info DIR)");
  LS_REQUIRE(pos[0] == "info", "lockstep ckpt: unknown verb '", pos[0], "' (expected: info)");
  args.finish("ckpt info");
  LS_REQUIRE(pos.size() == 2, "lockstep ckpt info: expected one DIR, got ", pos.size() - 1,
             " arguments");
  print_info(load_dir_or_root(pos[1]), std::cout);
  return 0;
}

}  // namespace lockstep::cli
