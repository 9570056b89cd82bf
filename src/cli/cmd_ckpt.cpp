// `lockstep ckpt info DIR`: load and verify a checkpoint, print what it holds and its model hash.
// `lockstep ckpt verify DIR`: every checkpoint of a root (or the one checkpoint DIR) loaded and
// verified — every file present and of its size, every shard's checksum, every tensor covered —
// one line each, exit 1 when any fails.
// `lockstep ckpt export (DIR | --config FILE) OUT`: write the model's parameters as safetensors —
// a checkpoint's (verified first), or the initial parameters a config's [model] seed gives, so that
// another framework can start from exactly the parameters Lockstep starts from.
// DIR is a checkpoint (step_* directory) or a checkpoint root, meaning its newest valid checkpoint.
// `lockstep ckpt convert DIR --to-layout dp=D,tp=T,... OUT`: DIR rewritten under root OUT as that
// layout would have saved it (src/train/checkpoint_convert.hpp).
// These commands only read checkpoints; they do not repair, convert in place or delete them.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>

#include "src/ckpt/checkpoint.hpp"
#include "src/ckpt/safetensors.hpp"
#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"
#include "src/model/model.hpp"
#include "src/train/checkpoint_convert.hpp"
#include "src/train/config.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kCkptUsage =
    "usage: lockstep ckpt info DIR\n"
    "       lockstep ckpt verify DIR\n"
    "       lockstep ckpt export DIR OUT\n"
    "       lockstep ckpt export --config FILE [--section.key=value ...] OUT\n"
    "       lockstep ckpt convert DIR --to-layout dp=D,tp=T[,sp=true|false][,zero=Z][,ep=E] OUT\n"
    "  DIR: a checkpoint directory (step_XXXXXXXX) or a checkpoint root (its newest valid one)\n"
    "  info prints step, layout, one line per tensor (name dtype shape xxh64), then `model hash H`\n"
    "  verify loads every checkpoint under a root (or DIR alone) and checks every file, shard and\n"
    "  checksum: `ok DIR ...` or `FAILED DIR: why` each, exit 1 if any failed\n"
    "  export writes the model parameters to OUT in safetensors format (names without the\n"
    "  checkpoint's 'model/' prefix, e.g. layer/0/attn/qkv/weight); with --config, the initial\n"
    "  parameters of the config's [model] (its seed); __metadata__ holds the model config and the\n"
    "  model hash\n"
    "  convert writes DIR again under the root OUT as the layout given would have saved it (one data\n"
    "  file per rank, each rank's share; keys not given keep DIR's), refusing a layout the model does\n"
    "  not divide; the tensors and the model hash are DIR's\n";

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
    shape_width = std::max(shape_width, ckpt::shape_text(t.shape).size());
    total += t.bytes.size();
  }
  out << "tensors " << c.tensors.size() << " (" << total << " bytes)\n";
  for (const auto& t : c.tensors) {
    out << "  " << std::left << std::setw(static_cast<int>(name_width)) << t.name << "  "
        << std::setw(static_cast<int>(dtype_width)) << dtype_name(t.dtype) << "  "
        << std::setw(static_cast<int>(shape_width)) << ckpt::shape_text(t.shape) << "  " << hex64(t.xxh64)
        << "\n";
  }
  out << "model hash " << hex64(ckpt::model_hash(c)) << "\n";
}

// The [model] fields a reader needs to rebuild the model, as safetensors metadata (string values).
std::map<std::string, std::string> model_metadata(const ModelConfig& m) {
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"producer", "lockstep"},
      {"vocab_size", std::to_string(m.vocab_size)},
      {"seq_len", std::to_string(m.seq_len)},
      {"d_model", std::to_string(m.d_model)},
      {"n_layers", std::to_string(m.n_layers)},
      {"n_heads", std::to_string(m.n_heads)},
      {"n_kv_heads", std::to_string(m.n_kv_heads)},
      {"ffn_hidden", std::to_string(m.ffn_width())},
      {"ffn", ffn_name(m.ffn)},
      {"norm", norm_name(m.norm)},
      {"pos", pos_name(m.pos)},
      {"tie_embeddings", m.tie_embeddings ? "true" : "false"},
      {"bias", m.bias ? "true" : "false"},
      {"norm_eps", str_cat(std::setprecision(9), m.norm_eps)},
      {"seed", std::to_string(m.seed)}};
  if (m.moe_experts > 0) {
    meta.insert({{"moe_experts", std::to_string(m.moe_experts)},
                 {"moe_top_k", std::to_string(m.moe_top_k)},
                 {"moe_every", std::to_string(m.moe_every)},
                 {"moe_ffn_hidden", std::to_string(m.moe_ffn_width())},
                 {"moe_router", router_name(m.moe_router)},
                 {"moe_normalize", m.moe_normalize ? "true" : "false"},
                 {"moe_shared_experts", std::to_string(m.moe_shared_experts)}});
  }
  return meta;
}

// Every checkpoint under root `dir` (or `dir` itself when it is one), verified; true when all load.
bool verify_checkpoints(const std::string& dir, std::ostream& out) {
  std::vector<std::string> all = ckpt::list_checkpoints(dir);
  if (all.empty()) all.push_back(dir);
  size_t failed = 0;
  for (const std::string& d : all) {
    try {
      const ckpt::Checkpoint c = ckpt::load(d);
      uint64_t bytes = 0;
      for (const auto& t : c.tensors) bytes += t.bytes.size();
      out << "ok " << d << " (step " << c.step << ", " << c.tensors.size() << " tensors, "
          << c.manifest["files"].size() << " files, " << bytes << " bytes; model hash " << hex64(ckpt::model_hash(c))
          << ")\n";
    } catch (const DataError& e) {
      ++failed;
      out << "FAILED " << d << ": " << e.what() << "\n";
    }
  }
  out << "verified " << all.size() << (all.size() == 1 ? " checkpoint: " : " checkpoints: ") << all.size() - failed
      << " ok, " << failed << " failed\n";
  return failed == 0;
}

// Parameters of checkpoint DIR: its "model/" tensors with the prefix removed.
void export_checkpoint(const std::string& dir, const std::string& out_path) {
  const ckpt::Checkpoint c = load_dir_or_root(dir);
  std::vector<ckpt::TensorRef> refs;
  const std::string prefix = ckpt::kModelPrefix;
  for (const auto& t : c.tensors) {
    if (t.name.compare(0, prefix.size(), prefix) != 0) continue;
    refs.push_back({t.name.substr(prefix.size()), t.dtype, t.shape, t.bytes.data()});
  }
  LS_REQUIRE(!refs.empty(), c.dir, ": no model parameters ('", prefix, "*' tensors) to export");
  std::map<std::string, std::string> meta{{"format", "pt"}, {"producer", "lockstep"},
                                          {"checkpoint", c.dir}, {"step", std::to_string(c.step)},
                                          {"model_hash", hex64(ckpt::model_hash(c))}};
  ckpt::save_safetensors(out_path, refs, meta);
  std::cout << "exported " << refs.size() << " tensors of " << c.dir << " (model hash "
            << meta["model_hash"] << ") to " << out_path << "\n";
}

// The initial parameters of a config's model (Model::init_parameters from [model] seed).
void export_initial(const RunConfig& cfg, const std::string& out_path) {
  Model model(cfg.model, cfg.train.mode, 1);
  model.init_parameters();
  std::vector<ckpt::TensorRef> refs, hashed;
  const std::string prefix = ckpt::kModelPrefix;
  for (const auto& t : model.param_layout()) {
    refs.push_back({t.name, DType::kF32, t.shape, model.params() + t.offset});
    hashed.push_back({prefix + t.name, DType::kF32, t.shape, model.params() + t.offset});
  }
  // The hash the trainer's checkpoint of these parameters would carry (names with the prefix).
  auto meta = model_metadata(cfg.model);
  meta["model_hash"] = hex64(ckpt::model_hash(hashed));
  meta["config"] = cfg.source;
  ckpt::save_safetensors(out_path, refs, meta);
  std::cout << "exported " << refs.size() << " initial tensors of " << cfg.source << " (model hash "
            << meta["model_hash"] << ") to " << out_path << "\n";
}

}  // namespace

int cmd_ckpt(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kCkptUsage;
    return 0;
  }
  const auto& pos = args.positionals();
  LS_REQUIRE(!pos.empty(), "lockstep ckpt: missing verb (usage: lockstep ckpt info|verify|export|convert ...)");
  LS_REQUIRE(pos[0] == "info" || pos[0] == "verify" || pos[0] == "export" || pos[0] == "convert",
             "lockstep ckpt: unknown verb '", pos[0], "' (expected: info, verify, export, convert)");
  if (pos[0] == "convert") {
    const auto to_layout = args.take("to-layout");
    args.finish("ckpt convert");
    LS_REQUIRE(to_layout.has_value(), "lockstep ckpt convert: --to-layout dp=D,tp=T[,sp=..][,zero=Z] is required");
    LS_REQUIRE(pos.size() == 3, "lockstep ckpt convert: expected DIR OUT, got ", pos.size() - 1, " arguments");
    const ConvertedCheckpoint c = convert_checkpoint(load_dir_or_root(pos[1]), *to_layout, pos[2]);
    std::cout << "converted step " << c.step << " to " << *to_layout << ": " << c.dir << " (" << c.files
              << " data files, " << c.bytes << " bytes, the largest " << c.largest << "; model hash " << c.model_hash
              << ")\n";
    return 0;
  }
  if (pos[0] == "verify") {
    args.finish("ckpt verify");
    LS_REQUIRE(pos.size() == 2, "lockstep ckpt verify: expected one DIR, got ", pos.size() - 1, " arguments");
    LS_REQUIRE(durable_io::is_dir(pos[1]), "lockstep ckpt verify: ", pos[1], ": no such directory");
    return verify_checkpoints(pos[1], std::cout) ? 0 : 1;
  }
  if (pos[0] == "export") {
    const auto config = args.take("config");
    const auto overrides = args.take_dotted();
    args.finish("ckpt export");
    if (config) {
      LS_REQUIRE(pos.size() == 2, "lockstep ckpt export --config FILE: expected one OUT, got ",
                 pos.size() - 1, " arguments");
      export_initial(load_run_config(*config, overrides, ConfigUse::kBench), pos[1]);
    } else {
      LS_REQUIRE(overrides.empty(), "lockstep ckpt export DIR OUT: --", overrides[0].first,
                 " is a config override; it needs --config FILE");
      LS_REQUIRE(pos.size() == 3, "lockstep ckpt export: expected DIR OUT (or --config FILE OUT), got ",
                 pos.size() - 1, " arguments");
      export_checkpoint(pos[1], pos[2]);
    }
    return 0;
  }
  args.finish("ckpt info");
  LS_REQUIRE(pos.size() == 2, "lockstep ckpt info: expected one DIR, got ", pos.size() - 1,
             " arguments");
  print_info(load_dir_or_root(pos[1]), std::cout);
  return 0;
}

}  // namespace lockstep::cli
