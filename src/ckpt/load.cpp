// Reading and verifying checkpoints, listing them, and finding the newest valid one (format in
// checkpoint.hpp). Only reads: never repairs or deletes anything (that is save's job).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"

namespace lockstep::ckpt {
namespace {

using nlohmann::json;

// Checked access to manifest fields: every failure names the manifest file and the field path.
class ManifestReader {
 public:
  explicit ManifestReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(str_cat(path_, ": ", what));
  }

  const json& field(const json& obj, const std::string& where, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(str_cat("field '", where, key, "' missing"));
    return *it;
  }
  int64_t integer(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_number_integer()) fail(str_cat("field '", where, key, "' must be an integer, got ", v.dump()));
    return v.get<int64_t>();
  }
  std::string string(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_string()) fail(str_cat("field '", where, key, "' must be a string, got ", v.dump()));
    return v.get<std::string>();
  }
  const json& array(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_array()) fail(str_cat("field '", where, key, "' must be an array"));
    return v;
  }
  const json& object(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_object()) fail(str_cat("field '", where, key, "' must be an object"));
    return v;
  }
  // A list of non-negative dims whose product (times elem_bytes) fits in int64.
  std::vector<int64_t> shape(const json& obj, const std::string& where, const char* key,
                             size_t elem_bytes) const {
    std::vector<int64_t> dims;
    int64_t total = static_cast<int64_t>(elem_bytes);
    for (const json& d : array(obj, where, key)) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail(str_cat("field '", where, key, "' must hold non-negative integers, got ", d.dump()));
      }
      dims.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(total, dims.back(), &total)) {
        fail(str_cat("field '", where, key, "' describes more than 2^63 bytes"));
      }
    }
    return dims;
  }

 private:
  std::string path_;
};

struct DataFile {
  std::string path;
  std::unique_ptr<durable_io::ReadFile> file;
};

// Opens every data file listed in the manifest and checks its exact size and header.
std::map<std::string, DataFile> open_files(const std::string& dir, const json& manifest,
                                           const ManifestReader& m) {
  std::map<std::string, DataFile> files;
  const json& list = m.array(manifest, "", "files");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = str_cat("files[", i, "].");
    std::string name = m.string(list[i], where, "name");
    int64_t bytes = m.integer(list[i], where, "bytes");
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
      m.fail(str_cat("field '", where, "name' must be a plain file name, got '", name, "'"));
    }
    const std::string path = dir + "/" + name;
    if (!durable_io::exists(path)) throw DataError(str_cat(path, ": missing (listed in the manifest)"));
    auto file = std::make_unique<durable_io::ReadFile>(path);
    if (file->size() != static_cast<uint64_t>(bytes)) {
      throw DataError(str_cat(path, ": ", file->size() < static_cast<uint64_t>(bytes) ? "truncated" : "too long",
                              ": ", file->size(), " bytes, manifest expects ", bytes));
    }
    char header[kDataHeaderBytes];
    if (file->size() < sizeof header) {
      throw DataError(str_cat(path, ": too short for a checkpoint data file header"));
    }
    file->read_at(0, header, sizeof header);
    uint32_t version;
    std::memcpy(&version, header + sizeof kDataMagic, sizeof version);
    if (std::memcmp(header, kDataMagic, sizeof kDataMagic) != 0 || version != kFormatVersion) {
      throw DataError(str_cat(path, ": not a version ", kFormatVersion,
                              " Lockstep checkpoint data file (bad magic or version)"));
    }
    files[name] = DataFile{path, std::move(file)};
  }
  return files;
}

// Reads and verifies one tensor entry. Only whole-tensor shards are read so far: a checkpoint
// written by a sharded layout (several shards per tensor) is rejected, not misread.
StoredTensor read_tensor(const json& entry, size_t index, const std::map<std::string, DataFile>& files,
                         const ManifestReader& m) {
  const std::string where = str_cat("tensors[", index, "].");
  StoredTensor t;
  t.name = m.string(entry, where, "name");
  const std::string dtype = m.string(entry, where, "dtype");
  try {
    t.dtype = dtype_from_name(dtype);
  } catch (const DataError& e) {
    m.fail(str_cat("tensor '", t.name, "': ", e.what()));
  }
  t.shape = m.shape(entry, where, "shape", dtype_size(t.dtype));
  const int64_t bytes = m.integer(entry, where, "bytes");
  const int64_t expected = numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
  if (bytes != expected) {
    m.fail(str_cat("tensor '", t.name, "': bytes is ", bytes, ", but its dtype and shape need ",
                   expected));
  }
  const json& shards = m.array(entry, where, "shards");
  if (shards.size() != 1) {
    m.fail(str_cat("tensor '", t.name, "' has ", shards.size(),
                   " shards; this version reads only checkpoints with one whole shard per tensor"));
  }
  const std::string swhere = where + "shards[0].";
  const json& shard = shards[0];
  const std::vector<int64_t> offsets = m.shape(shard, swhere, "offsets", 1);
  const std::vector<int64_t> shard_shape = m.shape(shard, swhere, "shape", dtype_size(t.dtype));
  if (shard_shape != t.shape || offsets != std::vector<int64_t>(t.shape.size(), 0)) {
    m.fail(str_cat("tensor '", t.name, "': its shard is not the whole tensor; this version reads "
                   "only checkpoints with one whole shard per tensor"));
  }
  if (m.integer(shard, swhere, "bytes") != bytes) {
    m.fail(str_cat("tensor '", t.name, "': shard bytes differ from tensor bytes (", bytes, ")"));
  }
  const std::string file_name = m.string(shard, swhere, "file");
  auto it = files.find(file_name);
  if (it == files.end()) {
    m.fail(str_cat("tensor '", t.name, "' is in file '", file_name, "', which 'files' does not list"));
  }
  const DataFile& file = it->second;
  const int64_t offset = m.integer(shard, swhere, "offset");
  if (offset < static_cast<int64_t>(kDataHeaderBytes) ||
      static_cast<uint64_t>(offset) + static_cast<uint64_t>(bytes) > file.file->size()) {
    throw DataError(str_cat(file.path, ": tensor '", t.name, "' at bytes [", offset, ", ",
                            offset + bytes, ") lies outside the file's data (", file.file->size(),
                            " bytes)"));
  }
  const std::string want = m.string(shard, swhere, "xxh64");
  t.bytes.resize(static_cast<size_t>(bytes));
  file.file->read_at(static_cast<uint64_t>(offset), t.bytes.data(), t.bytes.size());
  t.xxh64 = xxh64(t.bytes.data(), t.bytes.size());
  if (hex64(t.xxh64) != want) {
    throw DataError(str_cat(file.path, ": checksum mismatch in tensor '", t.name, "' (bytes [",
                            offset, ", ", offset + bytes, ")): manifest xxh64 ", want, ", found ",
                            hex64(t.xxh64)));
  }
  return t;
}

// The step encoded in a directory name "step_<digits>", or -1 if the name has another form.
int64_t step_of_dir_name(const std::string& name) {
  static const std::regex kStepDir("step_([0-9]{1,18})");
  std::smatch match;
  if (!std::regex_match(name, match, kStepDir)) return -1;
  return std::stoll(match[1].str());
}

}  // namespace

Checkpoint load(const std::string& dir) {
  if (!durable_io::is_dir(dir)) {
    throw DataError(str_cat(dir, durable_io::exists(dir) ? ": not a directory" : ": no such checkpoint directory"));
  }
  const std::string manifest_path = dir + "/" + kManifestFile;
  if (!durable_io::exists(manifest_path)) {
    throw DataError(str_cat(manifest_path,
                            ": missing (not a checkpoint directory, or its save did not finish)"));
  }
  ManifestReader m(manifest_path);
  Checkpoint ckpt;
  ckpt.dir = dir;
  try {
    ckpt.manifest = json::parse(durable_io::read_text(manifest_path));
  } catch (const json::parse_error& e) {
    m.fail(str_cat("malformed JSON: ", e.what()));
  }
  const json& manifest = ckpt.manifest;
  if (!manifest.is_object()) m.fail("malformed manifest: expected a JSON object");

  const std::string format = m.string(manifest, "", "format");
  const int64_t version = m.integer(manifest, "", "version");
  if (format != kFormatName || version != kFormatVersion) {
    m.fail(str_cat("format is '", format, "' version ", version, ", this build reads '",
                   kFormatName, "' version ", kFormatVersion));
  }
  ckpt.step = m.integer(manifest, "", "step");
  const int64_t named_step = step_of_dir_name(std::filesystem::path(dir).filename().string());
  if (named_step >= 0 && named_step != ckpt.step) {
    m.fail(str_cat("step is ", ckpt.step, " but the directory name says ", named_step));
  }
  m.object(manifest, "", "layout");
  ckpt.state = m.object(manifest, "", "state");

  const std::map<std::string, DataFile> files = open_files(dir, manifest, m);
  const json& entries = m.array(manifest, "", "tensors");
  for (size_t i = 0; i < entries.size(); ++i) {
    StoredTensor t = read_tensor(entries[i], i, files, m);
    if (ckpt.has(t.name)) m.fail(str_cat("tensor '", t.name, "' listed twice"));
    ckpt.tensors.push_back(std::move(t));
  }

  const std::string want_hash = m.string(manifest, "", "model_hash");
  const std::string found_hash = hex64(model_hash(ckpt));
  if (found_hash != want_hash) {
    m.fail(str_cat("model hash mismatch: manifest says ", want_hash, ", tensors give ", found_hash));
  }
  return ckpt;
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  if (!durable_io::exists(root)) return {};
  if (!durable_io::is_dir(root)) throw DataError(str_cat(root, ": not a directory"));
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = step_of_dir_name(name);
    if (step >= 0 && entry.is_directory()) found.emplace_back(step, root + "/" + name);
  }
  if (ec) throw DataError(str_cat(root, ": cannot list: ", ec.message()));
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::optional<Checkpoint> load_latest(const std::string& root, std::ostream& warnings) {
  const std::vector<std::string> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load(*it);
    } catch (const DataError& e) {
      warnings << "warning: skipping checkpoint " << *it << ": " << e.what() << "\n";
    }
  }
  return std::nullopt;
}

}  // namespace lockstep::ckpt
