// Reading and verifying checkpoints, listing them, and finding the newest valid one (format in
// checkpoint.hpp). Only reads: never repairs or deletes anything (that is save's job).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

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

// One shard as the manifest gives it, its place checked and turned into runs.
struct ParsedShard {
  ShardPlace place;
  std::vector<PlaceRun> runs;
  const DataFile* file = nullptr;
  int64_t offset = 0, bytes = 0;
  std::string xxh64;                // of the whole shard
  std::vector<std::string> blocks;  // of each kShardBlockBytes of it (version 2; empty in version 1)
};

// One tensor entry of the manifest, checked without reading any data: its dtype and shape, every
// shard's place, size and file range, and that the shards cover each element exactly once.
struct ParsedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<ParsedShard> shards;
};

// A shard's place as the manifest gives it: version 2's split_dim, ranges and elements, or version
// 1's one whole shard (offsets all zero, shape the tensor's).
ShardPlace read_place(const json& shard, const std::string& where, const ParsedTensor& t, int64_t version,
                      const ManifestReader& m) {
  ShardPlace p;
  if (version == 1) {
    const std::vector<int64_t> offsets = m.shape(shard, where, "offsets", 1);
    const std::vector<int64_t> shard_shape = m.shape(shard, where, "shape", dtype_size(t.dtype));
    const bool at_origin = offsets.size() == t.shape.size() &&
                           std::all_of(offsets.begin(), offsets.end(), [](int64_t o) { return o == 0; });
    if (shard_shape != t.shape || !at_origin) {
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

ParsedTensor parse_tensor(const json& entry, size_t index, int64_t version,
                          const std::map<std::string, DataFile>& files, const ManifestReader& m) {
  const std::string where = str_cat("tensors[", index, "].");
  ParsedTensor t;
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
  std::vector<std::pair<int64_t, int64_t>> covered;  // [global first, end) of every run
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string swhere = str_cat(where, "shards[", k, "].");
    const json& shard = shards[k];
    ParsedShard ps;
    ps.place = read_place(shard, swhere, t, version, m);
    std::string invalid;
    ps.runs = place_runs(t.shape, ps.place, &invalid);
    if (!invalid.empty()) m.fail(str_cat("tensor '", t.name, "' shard ", k, ": ", invalid));
    ps.bytes = m.integer(shard, swhere, "bytes");
    if (ps.bytes != (ps.place.end - ps.place.first) * elem) {
      m.fail(str_cat("tensor '", t.name, "' shard ", k, ": bytes is ", ps.bytes, ", its ",
                     ps.place.end - ps.place.first, " elements need ", (ps.place.end - ps.place.first) * elem));
    }
    const std::string file_name = m.string(shard, swhere, "file");
    auto it = files.find(file_name);
    if (it == files.end()) {
      m.fail(str_cat("tensor '", t.name, "' is in file '", file_name, "', which 'files' does not list"));
    }
    ps.file = &it->second;
    ps.offset = m.integer(shard, swhere, "offset");
    if (ps.offset < static_cast<int64_t>(kDataHeaderBytes) ||
        static_cast<uint64_t>(ps.offset) + static_cast<uint64_t>(ps.bytes) > ps.file->file->size()) {
      throw DataError(str_cat(ps.file->path, ": tensor '", t.name, "' at bytes [", ps.offset, ", ",
                              ps.offset + ps.bytes, ") lies outside the file's data (", ps.file->file->size(),
                              " bytes)"));
    }
    ps.xxh64 = m.string(shard, swhere, "xxh64");
    if (version >= 2) {
      const json& blocks = m.array(shard, swhere, "block_xxh64");
      const auto want_blocks = static_cast<size_t>((ps.bytes + kShardBlockBytes - 1) / kShardBlockBytes);
      if (blocks.size() != want_blocks) {
        m.fail(str_cat("tensor '", t.name, "' shard ", k, ": ", blocks.size(), " block checksums, its ", ps.bytes,
                       " bytes need ", want_blocks));
      }
      for (const json& b : blocks) ps.blocks.push_back(b.is_string() ? b.get<std::string>() : "");
    }
    for (const PlaceRun& r : ps.runs) covered.emplace_back(r.global, r.global + r.count);
    t.shards.push_back(std::move(ps));
  }
  if (const std::string gap = coverage_problem(covered, numel(t.shape), "shard"); !gap.empty()) {
    m.fail(str_cat("tensor '", t.name, "': ", gap));
  }
  return t;
}

DataError checksum_mismatch(const ParsedShard& s, const std::string& tensor, int64_t first, int64_t end,
                            const std::string& want, const std::string& found) {
  return DataError(str_cat(s.file->path, ": checksum mismatch in tensor '", tensor, "' (bytes [", first, ", ", end,
                           ")): manifest xxh64 ", want, ", found ", found));
}

// The whole tensor: every shard read and checked against its xxh64, its runs put in place.
StoredTensor read_tensor(const ParsedTensor& p) {
  StoredTensor t;
  t.name = p.name;
  t.dtype = p.dtype;
  t.shape = p.shape;
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype));
  t.bytes.resize(static_cast<size_t>(numel(t.shape) * elem));
  std::vector<std::byte> buf;
  for (const ParsedShard& s : p.shards) {
    buf.resize(static_cast<size_t>(s.bytes));
    s.file->file->read_at(static_cast<uint64_t>(s.offset), buf.data(), buf.size());
    const std::string found = hex64(xxh64(buf.data(), buf.size()));
    if (found != s.xxh64) throw checksum_mismatch(s, t.name, s.offset, s.offset + s.bytes, s.xxh64, found);
    for (const PlaceRun& r : s.runs) {
      std::memcpy(t.bytes.data() + r.global * elem, buf.data() + r.at * elem, static_cast<size_t>(r.count * elem));
    }
  }
  t.xxh64 = xxh64(t.bytes.data(), t.bytes.size());
  return t;
}

// A checkpoint directory's manifest, checked (format, version, step, layout, state) with every
// data file it lists open and of its size; no tensor data read.
struct OpenedCheckpoint {
  std::string dir;
  json manifest;
  int64_t version = 0, step = 0;
  std::map<std::string, DataFile> files;
  std::unique_ptr<ManifestReader> m;
};

OpenedCheckpoint open_checkpoint(const std::string& dir) {
  if (!durable_io::is_dir(dir)) {
    throw DataError(str_cat(dir, durable_io::exists(dir) ? ": not a directory" : ": no such checkpoint directory"));
  }
  const std::string manifest_path = dir + "/" + kManifestFile;
  if (!durable_io::exists(manifest_path)) {
    throw DataError(str_cat(manifest_path,
                            ": missing (not a checkpoint directory, or its save did not finish)"));
  }
  OpenedCheckpoint c;
  c.dir = dir;
  c.m = std::make_unique<ManifestReader>(manifest_path);
  const ManifestReader& m = *c.m;
  try {
    c.manifest = json::parse(durable_io::read_text(manifest_path));
  } catch (const json::parse_error& e) {
    m.fail(str_cat("malformed JSON: ", e.what()));
  }
  const json& manifest = c.manifest;
  if (!manifest.is_object()) m.fail("malformed manifest: expected a JSON object");
  const std::string format = m.string(manifest, "", "format");
  c.version = m.integer(manifest, "", "version");
  if (format != kFormatName || c.version < 1 || c.version > kFormatVersion) {
    m.fail(str_cat("format is '", format, "' version ", c.version, ", this build reads '",
                   kFormatName, "' versions 1 to ", kFormatVersion));
  }
  c.step = m.integer(manifest, "", "step");
  const int64_t named_step = step_of_dir_name(std::filesystem::path(dir).filename().string());
  if (named_step >= 0 && named_step != c.step) {
    m.fail(str_cat("step is ", c.step, " but the directory name says ", named_step));
  }
  m.object(manifest, "", "layout");
  m.object(manifest, "", "state");
  c.files = open_files(dir, manifest, m);
  return c;
}

}  // namespace

Checkpoint load(const std::string& dir) {
  const OpenedCheckpoint c = open_checkpoint(dir);
  const ManifestReader& m = *c.m;
  Checkpoint ckpt;
  ckpt.dir = dir;
  ckpt.manifest = c.manifest;
  ckpt.step = c.step;
  ckpt.state = c.manifest["state"];
  const json& entries = m.array(c.manifest, "", "tensors");
  for (size_t i = 0; i < entries.size(); ++i) {
    StoredTensor t = read_tensor(parse_tensor(entries[i], i, c.version, c.files, m));
    if (ckpt.has(t.name)) m.fail(str_cat("tensor '", t.name, "' listed twice"));
    ckpt.tensors.push_back(std::move(t));
  }
  // Version 1 always has one; a sharded save may have none (checkpoint.hpp).
  if (c.version == 1 || c.manifest.contains("model_hash")) {
    const std::string want_hash = m.string(c.manifest, "", "model_hash");
    const std::string found_hash = hex64(model_hash(ckpt));
    if (found_hash != want_hash) {
      m.fail(str_cat("model hash mismatch: manifest says ", want_hash, ", tensors give ", found_hash));
    }
  }
  return ckpt;
}

struct CheckpointReader::State {
  OpenedCheckpoint opened;
  std::map<std::string, ParsedTensor> tensors;
};

CheckpointReader::CheckpointReader(const std::string& dir) : state_(std::make_unique<State>()) {
  state_->opened = open_checkpoint(dir);
  const OpenedCheckpoint& c = state_->opened;
  const json& entries = c.m->array(c.manifest, "", "tensors");
  for (size_t i = 0; i < entries.size(); ++i) {
    ParsedTensor t = parse_tensor(entries[i], i, c.version, c.files, *c.m);
    const std::string name = t.name;
    if (!state_->tensors.emplace(name, std::move(t)).second) c.m->fail(str_cat("tensor '", name, "' listed twice"));
  }
}

CheckpointReader::~CheckpointReader() = default;

const std::string& CheckpointReader::dir() const { return state_->opened.dir; }
int64_t CheckpointReader::step() const { return state_->opened.step; }
const nlohmann::json& CheckpointReader::state() const { return state_->opened.manifest["state"]; }

void CheckpointReader::read(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const ShardPlace& want, void* dst) {
  const auto it = state_->tensors.find(name);
  if (it == state_->tensors.end()) {
    throw DataError(str_cat("checkpoint ", dir(), " has no tensor '", name, "'"));
  }
  const ParsedTensor& t = it->second;
  if (t.dtype != dtype || t.shape != shape) {
    throw DataError(str_cat("checkpoint ", dir(), ": tensor '", name, "' is ", dtype_name(t.dtype), " ",
                            shape_text(t.shape), ", expected ", dtype_name(dtype), " ", shape_text(shape)));
  }
  std::string invalid;
  std::vector<PlaceRun> wanted = place_runs(shape, want, &invalid);
  LS_CHECK(invalid.empty(), "CheckpointReader::read of '", name, "': ", invalid);
  // The stored runs of every shard and the wanted ones, both in global order; where they overlap,
  // a copy from shard bytes to dst bytes.
  struct Stored {
    PlaceRun run;
    size_t shard;
  };
  std::vector<Stored> stored;
  for (size_t k = 0; k < t.shards.size(); ++k) {
    for (const PlaceRun& r : t.shards[k].runs) stored.push_back({r, k});
  }
  std::sort(stored.begin(), stored.end(), [](const Stored& a, const Stored& b) { return a.run.global < b.run.global; });
  std::sort(wanted.begin(), wanted.end(), [](const PlaceRun& a, const PlaceRun& b) { return a.global < b.global; });
  struct Copy {
    size_t shard;
    int64_t from, to, count;  // elements: from the shard's element, to dst's
  };
  std::vector<Copy> copies;
  size_t i = 0;
  for (const PlaceRun& w : wanted) {
    while (i < stored.size() && stored[i].run.global + stored[i].run.count <= w.global) ++i;
    for (size_t j = i; j < stored.size() && stored[j].run.global < w.global + w.count; ++j) {
      const PlaceRun& s = stored[j].run;
      const int64_t lo = std::max(s.global, w.global), hi = std::min(s.global + s.count, w.global + w.count);
      if (lo < hi) copies.push_back({stored[j].shard, s.at + (lo - s.global), w.at + (lo - w.global), hi - lo});
    }
  }
  // The shards cover every element once (parse_tensor), so the copies cover what is wanted.
  std::sort(copies.begin(), copies.end(),
            [](const Copy& a, const Copy& b) { return a.shard != b.shard ? a.shard < b.shard : a.from < b.from; });
  const auto elem = static_cast<int64_t>(dtype_size(dtype));
  auto* out = static_cast<std::byte*>(dst);
  // Blocks are read whole and checked against their checksums; one block is held at a time.
  std::vector<std::byte> block;
  size_t held_shard = SIZE_MAX;
  int64_t held_block = -1;
  for (const Copy& c : copies) {
    const ParsedShard& s = t.shards[c.shard];
    if (s.blocks.empty()) {  // version 1: one checksum for the whole shard
      if (held_shard != c.shard) {
        block.resize(static_cast<size_t>(s.bytes));
        s.file->file->read_at(static_cast<uint64_t>(s.offset), block.data(), block.size());
        bytes_read_ += static_cast<uint64_t>(s.bytes);
        const std::string found = hex64(xxh64(block.data(), block.size()));
        if (found != s.xxh64) throw checksum_mismatch(s, name, s.offset, s.offset + s.bytes, s.xxh64, found);
        held_shard = c.shard;
      }
      std::memcpy(out + c.to * elem, block.data() + c.from * elem, static_cast<size_t>(c.count * elem));
      continue;
    }
    for (int64_t b0 = c.from * elem, done = 0; done < c.count * elem;) {
      const int64_t byte = b0 + done, index = byte / static_cast<int64_t>(kShardBlockBytes);
      const int64_t first = index * static_cast<int64_t>(kShardBlockBytes);
      const int64_t size = std::min<int64_t>(static_cast<int64_t>(kShardBlockBytes), s.bytes - first);
      if (held_shard != c.shard || held_block != index) {
        block.resize(static_cast<size_t>(size));
        s.file->file->read_at(static_cast<uint64_t>(s.offset + first), block.data(), block.size());
        bytes_read_ += static_cast<uint64_t>(size);
        const std::string found = hex64(xxh64(block.data(), block.size()));
        const std::string& expect = s.blocks[static_cast<size_t>(index)];
        if (found != expect) throw checksum_mismatch(s, name, s.offset + first, s.offset + first + size, expect, found);
        held_shard = c.shard;
        held_block = index;
      }
      const int64_t n = std::min(c.count * elem - done, first + size - byte);
      std::memcpy(out + c.to * elem + done, block.data() + (byte - first), static_cast<size_t>(n));
      done += n;
    }
  }
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
