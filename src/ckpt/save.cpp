// Writing a checkpoint durably — from one process, or sharded over several writers — replacing a
// re-saved step, and retention (format and guarantees in checkpoint.hpp). Not async: the caller's
// thread does the I/O.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"

namespace lockstep::ckpt {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

void validate(int64_t step, const std::vector<TensorRef>& tensors, const nlohmann::json& state) {
  LS_REQUIRE(step >= 0, "checkpoint step must be >= 0, got ", step);
  LS_REQUIRE(state.is_object(), "checkpoint state must be a JSON object, got ", state.type_name());
  std::set<std::string> seen;
  for (const TensorRef& t : tensors) {
    LS_REQUIRE(!t.name.empty(), "checkpoint tensor names must be non-empty");
    LS_REQUIRE(seen.insert(t.name).second, "checkpoint tensor '", t.name, "' given twice");
    for (int64_t d : t.shape) {
      LS_REQUIRE(d >= 0, "checkpoint tensor '", t.name, "' has a negative dim (", d, ")");
    }
    LS_REQUIRE(t.data != nullptr || numel(t.shape) == 0, "checkpoint tensor '", t.name,
               "' has no data");
  }
}

// Resolves what an interrupted save or retention left in `root` (see checkpoint.hpp): restores a
// replaced checkpoint whose replacement never landed, deletes everything else.
void resolve_leftovers(const std::string& root) {
  bool renamed = false;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    std::string path = join(root, name);
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".del-", 0) == 0) {
      durable_io::remove_tree(path);
    } else if (name.rfind(".old-", 0) == 0) {
      // .old-step_XXXXXXXX-<pid>
      std::string final_name = name.substr(5, name.rfind('-') - 5);
      std::string final_path = join(root, final_name);
      if (final_name.rfind("step_", 0) == 0 && !durable_io::exists(final_path)) {
        durable_io::rename_path(path, final_path);
        renamed = true;
      } else {
        durable_io::remove_tree(path);
      }
    }
  }
  if (ec) throw DataError(str_cat(root, ": cannot list: ", ec.message()));
  if (renamed) durable_io::fsync_dir(root);
}

size_t align_up(size_t n) { return (n + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }

std::string data_file_name(int writer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "tensors-%05d.bin", writer);
  return buf;
}

OrderedJson place_json(const ShardPlace& p) {
  OrderedJson ranges = OrderedJson::array();
  for (const auto& [first, end] : p.ranges) ranges.push_back({first, end});
  return {{"split_dim", p.split_dim}, {"ranges", ranges}, {"elements", {p.first, p.end}}};
}

void validate_shard(const ShardRef& s) {
  LS_REQUIRE(!s.name.empty(), "checkpoint tensor names must be non-empty");
  std::string invalid;
  place_runs(s.shape, s.place, &invalid);
  LS_REQUIRE(invalid.empty(), "checkpoint shard of '", s.name, "': ", invalid);
  LS_REQUIRE(s.data != nullptr || s.place.end == s.place.first, "checkpoint shard of '", s.name, "' has no data");
}

void write_manifest(const std::string& dir, const OrderedJson& manifest) {
  std::string text = manifest.dump(1) + "\n";
  durable_io::NewFile file(join(dir, kManifestFile));
  file.write(text.data(), text.size());
  file.close_synced();
}

// Removes all but the `keep` newest checkpoints, never `just_saved` nor one whose step is a
// multiple of keep_every (> 0), which are not counted. Each is renamed to .del-* first, so that a
// crash mid-delete leaves no half-deleted step_* directory behind.
void apply_retention(const std::string& root, int keep, int64_t keep_every, const std::string& just_saved) {
  if (keep <= 0) return;
  std::vector<std::string> all;
  for (std::string& dir : list_checkpoints(root)) {
    const int64_t step = step_of_dir_name(std::filesystem::path(dir).filename().string());
    if (keep_every <= 0 || step % keep_every != 0) all.push_back(std::move(dir));
  }
  size_t excess = all.size() > static_cast<size_t>(keep) ? all.size() - keep : 0;
  for (size_t i = 0; i < all.size() && excess > 0; ++i) {
    if (all[i] == just_saved) continue;
    std::string doomed = join(root, ".del-" + std::filesystem::path(all[i]).filename().string() +
                                        "-" + std::to_string(::getpid()));
    durable_io::rename_path(all[i], doomed);
    durable_io::remove_tree(doomed);
    --excess;
  }
}

// Renames the finished temporary directory to its step's name (keeping a replaced checkpoint
// whole until then) and applies retention.
std::string land(const std::string& root, int64_t step, const std::string& tmp, int keep, int64_t keep_every) {
  const std::string name = step_dir_name(step);
  const std::string final_dir = join(root, name);
  if (durable_io::exists(final_dir)) {
    // Re-saving a step: the old copy stays whole under .old-* until the new one has its name.
    const std::string old = join(root, ".old-" + name + "-" + std::to_string(::getpid()));
    durable_io::rename_path(final_dir, old);
    durable_io::rename_path(tmp, final_dir);
    durable_io::fsync_dir(root);
    durable_io::remove_tree(old);
  } else {
    durable_io::rename_path(tmp, final_dir);
    durable_io::fsync_dir(root);
  }
  apply_retention(root, keep, keep_every, final_dir);
  return final_dir;
}

}  // namespace

std::string begin_save(const std::string& root, int64_t step) {
  LS_REQUIRE(step >= 0, "checkpoint step must be >= 0, got ", step);
  durable_io::make_dirs(root);
  resolve_leftovers(root);
  const std::string tmp = join(root, ".tmp-" + step_dir_name(step) + "-" + std::to_string(::getpid()));
  durable_io::make_dir(tmp);
  return tmp;
}

nlohmann::json write_shards(const std::string& tmp, int writer, const std::vector<ShardRef>& shards) {
  LS_REQUIRE(writer >= 0, "checkpoint writer number must be >= 0, got ", writer);
  for (const ShardRef& s : shards) validate_shard(s);
  const std::string name = data_file_name(writer);
  durable_io::NewFile file(join(tmp, name));
  unsigned char header[kDataHeaderBytes] = {};
  std::copy(std::begin(kDataMagic), std::end(kDataMagic), header);
  const uint32_t version = kDataFileVersion;
  std::memcpy(header + sizeof kDataMagic, &version, sizeof version);
  file.write(header, sizeof header);
  nlohmann::json entries = nlohmann::json::array();
  for (const ShardRef& s : shards) {
    file.write_zeros(align_up(file.bytes_written()) - file.bytes_written());
    const uint64_t offset = file.bytes_written();
    const size_t bytes = static_cast<size_t>(s.place.end - s.place.first) * dtype_size(s.dtype);
    file.write(s.data, bytes);
    OrderedJson shard = place_json(s.place);
    shard["file"] = name;
    shard["offset"] = offset;
    shard["bytes"] = bytes;
    shard["xxh64"] = hex64(xxh64(s.data, bytes));
    OrderedJson blocks = OrderedJson::array();
    for (size_t b = 0; b < bytes; b += kShardBlockBytes) {
      blocks.push_back(hex64(xxh64(static_cast<const std::byte*>(s.data) + b, std::min(kShardBlockBytes, bytes - b))));
    }
    shard["block_xxh64"] = std::move(blocks);
    entries.push_back({{"tensor", s.name}, {"dtype", std::string(dtype_name(s.dtype))}, {"shard", shard}});
  }
  const uint64_t total = file.bytes_written();
  file.close_synced();
  return {{"file", {{"name", name}, {"bytes", total}}}, {"shards", entries}};
}

std::string finish_save(const std::string& root, int64_t step, const std::string& tmp,
                        const std::vector<TensorDesc>& tensors, const std::vector<nlohmann::json>& records,
                        const nlohmann::json& layout, const nlohmann::json& state, const std::string& model_hash,
                        int keep, int64_t keep_every) {
  LS_REQUIRE(state.is_object(), "checkpoint state must be a JSON object, got ", state.type_name());
  try {
    // Each tensor's shards, in the records' order; a shard of an unknown tensor is a caller's bug.
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < tensors.size(); ++i) {
      LS_REQUIRE(!tensors[i].name.empty(), "checkpoint tensor names must be non-empty");
      LS_REQUIRE(index.emplace(tensors[i].name, i).second, "checkpoint tensor '", tensors[i].name, "' given twice");
    }
    std::vector<OrderedJson> shards(tensors.size(), OrderedJson::array());
    std::vector<int64_t> covered(tensors.size(), 0);
    OrderedJson files = OrderedJson::array();
    for (const nlohmann::json& r : records) {
      files.push_back(OrderedJson::parse(r.at("file").dump()));
      for (const nlohmann::json& e : r.at("shards")) {
        const std::string name = e.at("tensor").get<std::string>();
        const auto it = index.find(name);
        LS_REQUIRE(it != index.end(), "checkpoint shard of '", name, "', a tensor the save does not list");
        LS_REQUIRE(e.at("dtype").get<std::string>() == dtype_name(tensors[it->second].dtype), "checkpoint shard of '",
                   name, "' is ", e.at("dtype").get<std::string>(), ", the tensor ", dtype_name(tensors[it->second].dtype));
        const nlohmann::json& elements = e.at("shard").at("elements");
        covered[it->second] += elements[1].get<int64_t>() - elements[0].get<int64_t>();
        shards[it->second].push_back(OrderedJson::parse(e.at("shard").dump()));
      }
    }
    OrderedJson entries = OrderedJson::array();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorDesc& t = tensors[i];
      LS_REQUIRE(covered[i] == numel(t.shape), "checkpoint tensor '", t.name, "': its shards hold ", covered[i],
                 " elements, the tensor has ", numel(t.shape));
      entries.push_back({{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape},
                         {"bytes", static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype)},
                         {"shards", std::move(shards[i])}});
    }
    OrderedJson manifest = {{"format", kFormatName},
                            {"version", kFormatVersion},
                            {"step", step},
                            {"layout", OrderedJson::parse(layout.dump())},
                            {"files", std::move(files)},
                            {"tensors", std::move(entries)}};
    if (!model_hash.empty()) manifest["model_hash"] = model_hash;
    manifest["state"] = OrderedJson::parse(state.dump());
    write_manifest(tmp, manifest);
    durable_io::fsync_dir(tmp);
  } catch (...) {
    // Best effort: the next save removes whatever is left.
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
  return land(root, step, tmp, keep, keep_every);
}

std::string save(const std::string& root, int64_t step, const std::vector<TensorRef>& tensors,
                 const nlohmann::json& state, int keep, int64_t keep_every) {
  validate(step, tensors, state);
  std::vector<ShardRef> shards;
  std::vector<TensorDesc> descs;
  for (const TensorRef& t : tensors) {
    shards.push_back({t.name, t.dtype, t.shape, ShardPlace{-1, {}, 0, numel(t.shape)}, t.data});
    descs.push_back({t.name, t.dtype, t.shape});
  }
  const std::string tmp = begin_save(root, step);
  nlohmann::json record;
  try {
    record = write_shards(tmp, 0, shards);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
  return finish_save(root, step, tmp, descs, {record}, {{"dp", 1}, {"tp", 1}, {"pp", 1}}, state,
                     hex64(model_hash(tensors)), keep, keep_every);
}

}  // namespace lockstep::ckpt
