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
    if (std::memcmp(header, kDataMagic, sizeof kDataMagic) != 0 || version != kDataFileVersion) {
      throw DataError(str_cat(path, ": not a version ", kDataFileVersion,
                              " Lockstep checkpoint data file (bad magic or version)"));
    }
    files[name] = DataFile{path, std::move(file)};
  }
  return files;
}

// A run of a shard's elements that is contiguous in the global tensor too: `count` elements from
// the shard's element `at` (counted from the shard's first) to the global flat index `global`.
struct Run {
  int64_t at, global, count;
};

// The runs of a shard's elements (format in checkpoint.hpp), or the reason its place is invalid.
std::vector<Run> shard_runs(const std::vector<int64_t>& shape, const ShardPlace& p, std::string* invalid) {
  std::vector<Run> runs;
  const int64_t total = numel(shape);
  if (p.split_dim < 0) {
    if (p.first < 0 || p.first > p.end || p.end > total) {
      *invalid = str_cat("elements [", p.first, ", ", p.end, ") outside the tensor's ", total);
      return {};
    }
    if (p.end > p.first) runs.push_back({0, p.first, p.end - p.first});
    return runs;
  }
  if (p.split_dim >= static_cast<int>(shape.size())) {
    *invalid = str_cat("split_dim ", p.split_dim, " is not a dim of the ", shape.size(), "-dim tensor");
    return {};
  }
  const auto d = static_cast<size_t>(p.split_dim);
  int64_t outer = 1, inner = 1, along = 0;
  for (size_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<int64_t> starts;  // local index along d where each range begins
  for (const auto& [first, end] : p.ranges) {
    if (first < 0 || first > end || end > shape[d]) {
      *invalid = str_cat("range [", first, ", ", end, ") outside dim ", d, " (", shape[d], ")");
      return {};
    }
    starts.push_back(along);
    along += end - first;
  }
  if (p.first < 0 || p.first > p.end || p.end > outer * along * inner) {
    *invalid = str_cat("elements [", p.first, ", ", p.end, ") outside its slices' ", outer * along * inner);
    return {};
  }
  for (int64_t i = p.first; i < p.end;) {
    const int64_t o = i / (along * inner), l = i / inner % along, j = i % inner;
    const size_t r = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), l) - starts.begin()) - 1;
    const int64_t in_range = l - starts[r];
    const int64_t count = std::min((p.ranges[r].second - p.ranges[r].first - in_range) * inner - j, p.end - i);
    runs.push_back({i - p.first, (o * shape[d] + p.ranges[r].first + in_range) * inner + j, count});
    i += count;
  }
  return runs;
}

// A shard's place as the manifest gives it: version 2's split_dim, ranges and elements, or version
// 1's one whole shard (offsets all zero, shape the tensor's).
ShardPlace read_place(const json& shard, const std::string& where, const StoredTensor& t, int64_t version,
                      const ManifestReader& m) {
  ShardPlace p;
  if (version == 1) {
    const std::vector<int64_t> offsets = m.shape(shard, where, "offsets", 1);
    const std::vector<int64_t> shard_shape = m.shape(shard, where, "shape", dtype_size(t.dtype));
    if (shard_shape != t.shape || offsets != std::vector<int64_t>(t.shape.size(), 0)) {
      m.fail(str_cat("tensor '", t.name, "': a version 1 shard must be the whole tensor"));
    }
    p.end = numel(t.shape);
    return p;
  }
  p.split_dim = static_cast<int>(m.integer(shard, where, "split_dim"));
  for (const json& r : m.array(shard, where, "ranges")) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer()) {
      m.fail(str_cat("field '", where, "ranges' must hold [first, end] pairs, got ", r.dump()));
    }
    p.ranges.emplace_back(r[0].get<int64_t>(), r[1].get<int64_t>());
  }
  const json& e = m.array(shard, where, "elements");
  if (e.size() != 2 || !e[0].is_number_integer() || !e[1].is_number_integer()) {
    m.fail(str_cat("field '", where, "elements' must be [first, end], got ", e.dump()));
  }
  p.first = e[0].get<int64_t>();
  p.end = e[1].get<int64_t>();
  return p;
}

// Reads and verifies one tensor entry: every shard's place, size and checksum, assembled into the
// whole tensor, each element covered exactly once.
StoredTensor read_tensor(const json& entry, size_t index, int64_t version,
                         const std::map<std::string, DataFile>& files, const ManifestReader& m) {
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
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t expected = numel(t.shape) * elem;
  if (bytes != expected) {
    m.fail(str_cat("tensor '", t.name, "': bytes is ", bytes, ", but its dtype and shape need ",
                   expected));
  }
  const json& shards = m.array(entry, where, "shards");
  if (version == 1 && shards.size() != 1) {
    m.fail(str_cat("tensor '", t.name, "' has ", shards.size(), " shards; version 1 has one whole shard per tensor"));
  }
  t.bytes.resize(static_cast<size_t>(bytes));
  std::vector<std::pair<int64_t, int64_t>> covered;  // [global first, end) of every run
  std::vector<std::byte> buf;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string swhere = str_cat(where, "shards[", k, "].");
    const json& shard = shards[k];
    const ShardPlace place = read_place(shard, swhere, t, version, m);
    std::string invalid;
    const std::vector<Run> runs = shard_runs(t.shape, place, &invalid);
    if (!invalid.empty()) m.fail(str_cat("tensor '", t.name, "' shard ", k, ": ", invalid));
    const int64_t shard_bytes = m.integer(shard, swhere, "bytes");
    if (shard_bytes != (place.end - place.first) * elem) {
      m.fail(str_cat("tensor '", t.name, "' shard ", k, ": bytes is ", shard_bytes, ", its ",
                     place.end - place.first, " elements need ", (place.end - place.first) * elem));
    }
    const std::string file_name = m.string(shard, swhere, "file");
    auto it = files.find(file_name);
    if (it == files.end()) {
      m.fail(str_cat("tensor '", t.name, "' is in file '", file_name, "', which 'files' does not list"));
    }
    const DataFile& file = it->second;
    const int64_t offset = m.integer(shard, swhere, "offset");
    if (offset < static_cast<int64_t>(kDataHeaderBytes) ||
        static_cast<uint64_t>(offset) + static_cast<uint64_t>(shard_bytes) > file.file->size()) {
      throw DataError(str_cat(file.path, ": tensor '", t.name, "' at bytes [", offset, ", ",
                              offset + shard_bytes, ") lies outside the file's data (", file.file->size(),
                              " bytes)"));
    }
    const std::string want = m.string(shard, swhere, "xxh64");
    buf.resize(static_cast<size_t>(shard_bytes));
    file.file->read_at(static_cast<uint64_t>(offset), buf.data(), buf.size());
    const std::string found = hex64(xxh64(buf.data(), buf.size()));
    if (found != want) {
      throw DataError(str_cat(file.path, ": checksum mismatch in tensor '", t.name, "' (bytes [",
                              offset, ", ", offset + shard_bytes, ")): manifest xxh64 ", want, ", found ",
                              found));
    }
    for (const Run& r : runs) {
      std::memcpy(t.bytes.data() + r.global * elem, buf.data() + r.at * elem, static_cast<size_t>(r.count * elem));
      covered.emplace_back(r.global, r.global + r.count);
    }
  }
  std::sort(covered.begin(), covered.end());
  int64_t next = 0;
  for (const auto& [first, end] : covered) {
    if (first != next) {
      m.fail(str_cat("tensor '", t.name, "': ", first < next ? "element " + std::to_string(first) + " is in two shards"
                                                             : "elements [" + std::to_string(next) + ", " +
                                                                   std::to_string(first) + ") are in no shard"));
    }
    next = end;
  }
  if (next != numel(t.shape)) {
    m.fail(str_cat("tensor '", t.name, "': elements [", next, ", ", numel(t.shape), ") are in no shard"));
  }
  t.xxh64 = xxh64(t.bytes.data(), t.bytes.size());
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
  if (format != kFormatName || version < 1 || version > kFormatVersion) {
    m.fail(str_cat("format is '", format, "' version ", version, ", this build reads '",
                   kFormatName, "' versions 1 to ", kFormatVersion));
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
    StoredTensor t = read_tensor(entries[i], i, version, files, m);
    if (ckpt.has(t.name)) m.fail(str_cat("tensor '", t.name, "' listed twice"));
    ckpt.tensors.push_back(std::move(t));
  }

  // Version 1 always has one; a sharded save has none (checkpoint.hpp).
  if (version == 1 || manifest.contains("model_hash")) {
    const std::string want_hash = m.string(manifest, "", "model_hash");
    const std::string found_hash = hex64(model_hash(ckpt));
    if (found_hash != want_hash) {
      m.fail(str_cat("model hash mismatch: manifest says ", want_hash, ", tensors give ", found_hash));
    }
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
