#include "src/train/checkpoint_convert.hpp"

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"
#include "src/core/hash.hpp"
#include "src/model/param_layout.hpp"
#include "src/parallel/data_parallel.hpp"
#include "src/parallel/expert_parallel.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/train/checkpointing.hpp"
#include "src/train/config.hpp"

namespace lockstep {

namespace {

// The run's configuration with the target layout: the source layout's dp, tp, sp, zero and ep, then
// those `to_layout` gives, checked as a run of that layout would check them.
RunConfig target_config(const ckpt::Checkpoint& c, const std::string& to_layout) {
  const nlohmann::json& state = c.state;
  LS_REQUIRE_DATA(state.contains("config") && state.contains("layout"), c.dir,
                  ": not a training run's checkpoint (its state has no config and layout to convert from)");
  const std::string source = "--to-layout " + to_layout;
  std::vector<std::pair<std::string, std::string>> layout;
  for (const char* key : {"dp", "tp", "sp", "zero", "ep"}) {
    if (const auto it = state["layout"].find(key); it != state["layout"].end()) {
      layout.emplace_back(str_cat("parallel.", key), it->is_string() ? it->get<std::string>() : it->dump());
    }
  }
  std::set<std::string> given;
  for (std::string_view item : split_commas(to_layout)) {
    const size_t eq = item.find('=');
    const std::string key(item.substr(0, eq));
    LS_REQUIRE(eq != std::string_view::npos &&
                   (key == "dp" || key == "tp" || key == "sp" || key == "zero" || key == "ep") &&
                   given.insert(key).second,
               source, ": expected key=value items of dp, tp, sp, zero and ep separated by commas, each once; '",
               item, "' is not one");
    layout.emplace_back("parallel." + key, std::string(item.substr(eq + 1)));
  }
  LS_REQUIRE(!given.empty(), source, ": no layout given (e.g. dp=2,tp=2)");
  RunConfig cfg = run_config_of_json(state["config"], source, layout, ConfigUse::kBench);
  const ParallelConfig& pc = cfg.parallel;
  LS_REQUIRE(pc.dp >= 1 && pc.tp >= 1 && pc.ep >= 1, source, ": dp, tp and ep must be >= 1 (got dp=", pc.dp,
             ", tp=", pc.tp, ", ep=", pc.ep, ")");
  const TrainConfig& tc = cfg.train;
  parallel::check_ep_layout(cfg.model, pc.ep, {.precision = tc.precision_recipe()}, source);
  const parallel::DpBatch part = parallel::plan_dp_batch(tc.batch_size, tc.micro_batch(), cfg.model.seq_len,
                                                         pc.dp * pc.ep, tc.mode, source, parallel::data_ranks_name(pc.ep));
  parallel::check_tp_layout(cfg.model, pc.tp, pc.sp, part.local_micro * cfg.model.seq_len, tc.mode, source);
  return cfg;
}

}  // namespace

ConvertedCheckpoint convert_checkpoint(const ckpt::Checkpoint& c, const std::string& to_layout,
                                       const std::string& out_root) {
  const RunConfig cfg = target_config(c, to_layout);
  const ParallelConfig& pc = cfg.parallel;
  const std::vector<ParamTensor> global = build_param_layout(cfg.model);
  LS_REQUIRE_DATA(c.tensors.size() == std::size(kStatePrefixes) * global.size(), c.dir, ": holds ", c.tensors.size(),
                  " tensors, not the ", std::size(kStatePrefixes) * global.size(),
                  " (parameters and two AdamW moments) of its run's model");
  // The source's global tensors, by name, as checked f32 tensors of the model's shapes.
  std::vector<const float*> data;  // kStatePrefixes × global, in that order
  std::vector<ckpt::TensorDesc> tensors;
  for (const char* prefix : kStatePrefixes) {
    for (const ParamTensor& p : global) {
      const ckpt::StoredTensor& t = c.tensor(prefix + p.name);
      LS_REQUIRE_DATA(t.dtype == DType::kF32 && t.shape == p.shape, c.dir, ": tensor ", t.name, " is ",
                      dtype_name(t.dtype), " ", ckpt::shape_text(t.shape), ", expected f32 ",
                      ckpt::shape_text(p.shape));
      data.push_back(reinterpret_cast<const float*>(t.bytes.data()));
      tensors.push_back({t.name, DType::kF32, p.shape});
    }
  }
  const std::filesystem::path final_dir = std::filesystem::path(out_root) / ckpt::step_dir_name(c.step);
  LS_REQUIRE(!std::filesystem::exists(final_dir), out_root, ": already holds ", final_dir.filename().string(),
             "; convert into a root without that step");

  ConvertedCheckpoint out;
  out.step = c.step;
  out.model_hash = hex64(ckpt::model_hash(c));
  const std::string tmp = ckpt::begin_save(out_root, c.step);
  std::vector<nlohmann::json> records;
  std::map<std::string, size_t> index_of;  // a tensor's place in `global`
  for (size_t i = 0; i < global.size(); ++i) index_of[global[i].name] = i;
  // Rank w of the mesh (tp fastest, then ep, dp slowest: src/parallel/mesh.hpp) writes what it
  // would have saved.
  for (int64_t w = 0; w < pc.dp * pc.ep * pc.tp; ++w) {
    const TpCoord tp{pc.tp, w % pc.tp};
    const EpCoord ep{pc.ep, (w / pc.tp) % pc.ep};
    const std::vector<ParamTensor> slice = hold_experts(build_param_layout(cfg.model, tp), ep);
    std::vector<std::vector<float>> buffers;
    std::vector<ckpt::ShardRef> shards;
    for (const SavedPiece& piece : saved_pieces(slice, pc.zero, pc.dp, w / (pc.tp * pc.ep), tp, ep)) {
      const ParamTensor& p = *piece.tensor;
      const size_t index = index_of.at(p.name);
      for (size_t k = 0; k < std::size(kStatePrefixes); ++k) {
        std::vector<float>& buf = buffers.emplace_back(static_cast<size_t>(piece.end - piece.first));
        const float* whole = data[k * global.size() + index];
        for (const IndexRun& run : p.global_runs(piece.first, piece.end)) {
          std::memcpy(buf.data() + (run.local - piece.first), whole + run.global,
                      static_cast<size_t>(run.length) * sizeof(float));
        }
        shards.push_back({kStatePrefixes[k] + p.name, DType::kF32, p.global_shape, piece.place(), buf.data()});
      }
    }
    if (shards.empty()) continue;
    records.push_back(ckpt::write_shards(tmp, static_cast<int>(w), shards));
    const auto bytes = records.back().at("file").at("bytes").get<uint64_t>();
    out.bytes += bytes;
    out.largest = std::max(out.largest, bytes);
  }
  out.files = static_cast<int64_t>(records.size());

  nlohmann::json state = c.state;
  nlohmann::json& layout = state["layout"];
  layout["dp"] = pc.dp;
  layout["tp"] = pc.tp;
  layout["sp"] = pc.sp;
  layout["zero"] = pc.zero;
  layout["pp"] = 1;
  if (pc.ep > 1) {
    layout["ep"] = pc.ep;
  } else {
    layout.erase("ep");
  }
  if (pc.tp > 1) {
    layout["tp_shards"] = parallel::describe_shards(cfg.model, pc.tp);
  } else {
    layout.erase("tp_shards");
  }
  state["config"]["parallel"] = cfg.to_json()["parallel"];
  nlohmann::json manifest_layout = {{"dp", pc.dp}, {"tp", pc.tp}, {"pp", 1}};
  if (pc.ep > 1) manifest_layout["ep"] = pc.ep;
  out.dir = ckpt::finish_save(out_root, c.step, tmp, tensors, records, manifest_layout, state, out.model_hash, 0);
  return out;
}

}  // namespace lockstep
