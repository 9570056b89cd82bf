// Writing a checkpoint durably, replacing a re-saved step, and retention (format and guarantees in
// checkpoint.hpp). Not async: the caller's thread does the I/O.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"

namespace lockstep::ckpt {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr const char* kDataFile = "tensors-00000.bin";  // writer 0: the only writer for now

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

// Writes every tensor into dir/kDataFile and returns the manifest's "tensors" and "files".
std::pair<OrderedJson, OrderedJson> write_data(const std::string& dir,
                                               const std::vector<TensorRef>& tensors) {
  durable_io::NewFile file(join(dir, kDataFile));
  unsigned char header[kDataHeaderBytes] = {};
  std::copy(std::begin(kDataMagic), std::end(kDataMagic), header);
  const uint32_t version = kFormatVersion;
  std::memcpy(header + sizeof kDataMagic, &version, sizeof version);
  file.write(header, sizeof header);

  OrderedJson entries = OrderedJson::array();
  for (const TensorRef& t : tensors) {
    file.write_zeros(align_up(file.bytes_written()) - file.bytes_written());
    const uint64_t offset = file.bytes_written();
    const size_t bytes = static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype);
    file.write(t.data, bytes);
    OrderedJson zeros = OrderedJson::array();
    for (size_t i = 0; i < t.shape.size(); ++i) zeros.push_back(0);
    OrderedJson shard = {{"offsets", zeros}, {"shape", t.shape}, {"file", kDataFile},
                         {"offset", offset}, {"bytes", bytes},
                         {"xxh64", hex64(xxh64(t.data, bytes))}};
    entries.push_back({{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape}, {"bytes", bytes},
                       {"shards", OrderedJson::array({shard})}});
  }
  const uint64_t total = file.bytes_written();
  file.close_synced();
  OrderedJson files = OrderedJson::array({{{"name", kDataFile}, {"bytes", total}}});
  return {std::move(entries), std::move(files)};
}

void write_manifest(const std::string& dir, const OrderedJson& manifest) {
  std::string text = manifest.dump(1) + "\n";
  durable_io::NewFile file(join(dir, kManifestFile));
  file.write(text.data(), text.size());
  file.close_synced();
}

// Removes all but the `keep` newest checkpoints, never `just_saved`. Each is renamed to .del-*
// first, so that a crash mid-delete leaves no half-deleted step_* directory behind.
void apply_retention(const std::string& root, int keep, const std::string& just_saved) {
  if (keep <= 0) return;
  std::vector<std::string> all = list_checkpoints(root);
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

}  // namespace

std::string save(const std::string& root, int64_t step, const std::vector<TensorRef>& tensors,
                 const nlohmann::json& state, int keep) {
  validate(step, tensors, state);
  durable_io::make_dirs(root);
  resolve_leftovers(root);

  const std::string name = step_dir_name(step);
  const std::string pid = std::to_string(::getpid());
  const std::string tmp = join(root, ".tmp-" + name + "-" + pid);
  const std::string final_dir = join(root, name);

  try {
    durable_io::make_dir(tmp);
    auto [entries, files] = write_data(tmp, tensors);
    OrderedJson manifest = {{"format", kFormatName},
                            {"version", kFormatVersion},
                            {"step", step},
                            {"layout", {{"dp", 1}, {"tp", 1}, {"pp", 1}}},
                            {"files", std::move(files)},
                            {"tensors", std::move(entries)},
                            {"model_hash", hex64(model_hash(tensors))},
                            {"state", OrderedJson::parse(state.dump())}};
    write_manifest(tmp, manifest);
    durable_io::fsync_dir(tmp);
  } catch (...) {
    // Best effort: the next save removes whatever is left.
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw;
  }

  if (durable_io::exists(final_dir)) {
    // Re-saving a step: the old copy stays whole under .old-* until the new one has its name.
    const std::string old = join(root, ".old-" + name + "-" + pid);
    durable_io::rename_path(final_dir, old);
    durable_io::rename_path(tmp, final_dir);
    durable_io::fsync_dir(root);
    durable_io::remove_tree(old);
  } else {
    durable_io::rename_path(tmp, final_dir);
    durable_io::fsync_dir(root);
  }
  apply_retention(root, keep, final_dir);
  return final_dir;
}

}  // namespace lockstep::ckpt
