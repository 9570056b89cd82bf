// Checkpoints: save a set of named tensors plus the trainer's state to a directory durably — from
// one process, or sharded, each of several writers (ranks) storing the pieces of tensors it holds —
// load and verify them, find the newest valid one, and hash the model they hold.
//
// This file is the public API and the on-disk format. It is not the trainer's resume logic (what
// goes into `state`, which rank writes and reads what, and how it is restored belongs to
// src/train), nor async writing. load() reads every shard and assembles whole tensors (the tools'
// view); CheckpointReader reads only the blocks that hold what one rank of some layout needs. A
// checkpoint written by any layout loads into any other.
//
// On-disk format, version 2
// -------------------------
// <root>/step_<step, zero-padded to 8 digits>/     one checkpoint
//   manifest.json                                  what is stored, with checksums (below)
//   tensors-<writer, 5 digits>.bin                 packed shard bytes written by one writer
//
// A data file starts with a 64-byte header: the 8 bytes "LSCKDATA", the data file version (1) as a
// little-endian uint32, then zeros. Each shard follows at an offset aligned to 64 bytes (so a later
// reader can mmap and use them in place), its elements little-endian (the in-memory layout on the
// hosts we run on). Padding bytes are zero.
//
// manifest.json (example, abridged):
//   {
//     "format": "lockstep-checkpoint", "version": 2, "step": 120,
//     "layout": {"dp": 2, "tp": 2, "pp": 1},
//     "files": [{"name": "tensors-00000.bin", "bytes": 4224}, {"name": "tensors-00001.bin", ...}],
//     "tensors": [
//       {"name": "model/wte", "dtype": "f32", "shape": [64, 16], "bytes": 4096,
//        "shards": [{"split_dim": 0, "ranges": [[0, 32]], "elements": [0, 512],
//                    "file": "tensors-00000.bin", "offset": 64, "bytes": 2048, "xxh64": "3f1c...",
//                    "block_xxh64": ["3f1c..."]},
//                   {"split_dim": 0, "ranges": [[32, 64]], "elements": [0, 512], ...}]}],
//     "model_hash": "9a0b1c2d3e4f5061",
//     "state": { ...free-form JSON supplied by the trainer... }
//   }
// "tensors" is in the order given to the save (the trainer passes parameters in the model's
// canonical order). "bytes" of a tensor is its global size. A shard is a ShardPlace (below): the
// slices "ranges" of dim "split_dim" of the global tensor (split_dim -1: the whole tensor) viewed
// as one row-major tensor, and of that the flat elements "elements" = [first, end); its bytes are
// those elements in order, at "offset" of "file", with the xxh64 of those bytes and of each
// kShardBlockBytes of them ("block_xxh64", the last block shorter). The shards of a
// tensor cover each of its elements exactly once. "files" lists every data file with its exact
// size, so truncation is reported per file before any tensor is read. "model_hash" is there when
// one writer held every parameter (a sharded save has no process that sees them all; `lockstep
// ckpt info` computes it from the loaded tensors). Version 1 — one writer, each tensor one whole
// shard given as "offsets" [0, ...] and "shape" — is still read.
//
// Durability (save): everything is written into <root>/.tmp-step_XXXXXXXX-<pid>, each file fsynced,
// the directory fsynced, renamed to step_XXXXXXXX, and <root> fsynced. A checkpoint directory under
// its final name is therefore always complete. Names in <root> that start with '.' belong to
// unfinished operations and are resolved by the next save:
//   .tmp-*  a save that did not finish: deleted;
//   .old-step_N-*  a checkpoint being replaced by a re-save of step N: restored to step_N if the
//           re-save never landed, else deleted;
//   .del-*  a checkpoint being removed by retention: deleted.
// One process begins and finishes saves into a root at a time (the trainer's first rank); writers
// only add their data files to the temporary directory between the two; load functions only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/dtype.hpp"
#include "src/core/hash.hpp"

namespace lockstep::ckpt {

inline constexpr const char* kFormatName = "lockstep-checkpoint";
inline constexpr int kFormatVersion = 2;
inline constexpr int kDataFileVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr char kDataMagic[8] = {'L', 'S', 'C', 'K', 'D', 'A', 'T', 'A'};
inline constexpr size_t kDataHeaderBytes = 64;
inline constexpr size_t kDataAlignment = 64;
// A shard's bytes are checksummed whole and in blocks of this size, so that a reader of a part of
// a shard (CheckpointReader) checks what it reads without reading the rest.
inline constexpr size_t kShardBlockBytes = size_t{1} << 20;
// Tensors whose names start with this prefix are model parameters (see model_hash).
inline constexpr const char* kModelPrefix = "model/";

// A tensor to save: the caller owns `data`, which holds numel(shape) * dtype_size(dtype) bytes in
// row-major order and must stay valid for the duration of save().
struct TensorRef {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Where a shard's elements lie in its global tensor (see the format above): the slices `ranges`
// ([first, end) indices, in order) of dim `split_dim` — a tensor-parallel rank's slice; split_dim
// < 0: the whole tensor — viewed as one row-major tensor, and of that the flat elements
// [first, end) — a ZeRO shard's part of it.
struct ShardPlace {
  int split_dim = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t first = 0, end = 0;
};

// A shard to save: `data` holds place.end - place.first elements of dtype, in order, and must stay
// valid for the duration of write_shards(). `shape` is the global tensor's.
struct ShardRef {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  ShardPlace place;
  const void* data;
};

// What a tensor of a sharded save is (its shards come from the writers).
struct TensorDesc {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// A tensor read back from a checkpoint, verified against its checksum.
struct StoredTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;  // the global tensor, row-major
  uint64_t xxh64;                // of `bytes`
};

// A loaded checkpoint whose every size and checksum has been verified.
struct Checkpoint {
  std::string dir;
  int64_t step;
  nlohmann::json manifest;  // as read from manifest.json
  nlohmann::json state;     // manifest["state"]: what the trainer passed to save()
  std::vector<StoredTensor> tensors;  // in manifest order

  // Throws DataError naming the checkpoint directory and `name` if there is no such tensor.
  const StoredTensor& tensor(const std::string& name) const;
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // in manifest order
  // Copies tensor `name` into dst (numel(shape) * dtype_size(dtype) bytes) after checking that the
  // stored dtype and shape are exactly those expected; DataError naming both otherwise.
  void copy_to(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
               void* dst) const;
};

// Product of the dims (1 for a scalar, shape {}).
int64_t numel(const std::vector<int64_t>& shape);

// "step_00000120".
std::string step_dir_name(int64_t step);
// The step a directory name "step_<digits>" encodes, or -1 for a name of another form.
int64_t step_of_dir_name(const std::string& name);
// "[64, 16]": a shape in messages.
std::string shape_text(const std::vector<int64_t>& shape);

// A run of a place's elements that is contiguous in the global tensor too: `count` elements from
// the place's element `at` (counted from its first) to the global flat index `global`.
struct PlaceRun {
  int64_t at, global, count;
};
// The elements a ShardPlace describes in a tensor of `shape`, as the fewest such runs in the
// place's order; or, in *invalid, why the place does not fit the tensor (a split_dim it lacks, a
// range outside its dim, elements outside the slices).
std::vector<PlaceRun> place_runs(const std::vector<int64_t>& shape, const ShardPlace& place, std::string* invalid);
// Whether the global index ranges [first, end) in `covered` hold each of a tensor's `numel`
// elements exactly once: "" if they do, else the first element that is not so ("element 5 is in
// two shards", "elements [8, 12) are in no shard", for `part` "shard"). Sorts `covered`.
std::string coverage_problem(std::vector<std::pair<int64_t, int64_t>>& covered, int64_t numel, const std::string& part);

// Writes a checkpoint of `tensors` and `state` (must be a JSON object) for `step` under `root`
// (created if missing), replacing an existing checkpoint of the same step, then removes all but the
// `keep` newest step_* directories (keep <= 0 keeps all; the one just written is never removed;
// nor is one whose step is a multiple of keep_every > 0, and those do not count against keep).
// Returns the final directory. Tensor names must be non-empty and unique; ConfigError otherwise.
// Any I/O failure throws DataError naming the path and the system error; checkpoints already under
// their final names are untouched by a failed save.
std::string save(const std::string& root, int64_t step, const std::vector<TensorRef>& tensors,
                 const nlohmann::json& state, int keep, int64_t keep_every = 0);

// The sharded save, for writers that are several processes sharing the root's file system (the
// coordination between them is the caller's):
//  1. begin_save, by one process: resolves leftovers in `root`, makes and returns the temporary
//     directory of `step`;
//  2. write_shards, by each writer (writer numbers distinct, >= 0) with the shards it holds: writes
//     tmp/tensors-<writer>.bin durably and returns its record (a JSON object: the file and its
//     shards), which the caller brings to the finishing process;
//  3. finish_save, by the process that began, once every writer's record is in: the manifest (the
//     tensors in the order of `tensors`, each with its shards from every record; ConfigError when
//     a tensor's shards do not add up to its size; model_hash "" when no writer saw every
//     parameter), then the rename and retention as save() does.
std::string begin_save(const std::string& root, int64_t step);
nlohmann::json write_shards(const std::string& tmp, int writer, const std::vector<ShardRef>& shards);
std::string finish_save(const std::string& root, int64_t step, const std::string& tmp,
                        const std::vector<TensorDesc>& tensors, const std::vector<nlohmann::json>& records,
                        const nlohmann::json& layout, const nlohmann::json& state, const std::string& model_hash,
                        int keep, int64_t keep_every = 0);

// Loads the checkpoint in `dir` and verifies the manifest, every file size, every shard's place,
// size and xxh64, that the shards cover each tensor exactly once, and the model hash where the
// manifest has one. Tensors come back whole, whatever layout wrote them. Any problem throws
// DataError naming the file, the tensor (if any), and what was expected versus found.
Checkpoint load(const std::string& dir);

// A checkpoint opened for reading parts of its tensors: the manifest and every data file checked as
// load() checks them (DataError otherwise), no tensor data read until asked. read() reads of tensor
// `name` (its dtype and global shape must be those given) the elements a ShardPlace describes —
// what one rank of some layout holds — into dst, in the place's order, reading only the stored
// blocks that hold them, each checked against its checksum (a version 1 shard whole, against its
// own); DataError naming the file and the tensor on a mismatch.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const;
  int64_t step() const;
  const nlohmann::json& state() const;  // what the saver passed
  void read(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const ShardPlace& want,
            void* dst);
  uint64_t bytes_read() const { return bytes_read_; }  // of data files, so far

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint64_t bytes_read_ = 0;
};

// The step_* directories of `root` (full paths) sorted by step, oldest first. Empty if root does
// not exist; DataError if it exists but is not a directory. Temporaries ('.'-prefixed) are ignored.
std::vector<std::string> list_checkpoints(const std::string& root);

// The newest checkpoint under `root` that loads. Each newer one that fails to load is skipped
// with one line on `warnings` naming its directory and why. nullopt if none loads (or none exist).
std::optional<Checkpoint> load_latest(const std::string& root, std::ostream& warnings);

// Model hash: one xxh64 (seed 0) over the parameter tensors (names starting with "model/"), in the
// order given, independent of any other tensor and of the layout the checkpoint was written from.
// For each parameter tensor the digest takes, in this order, with every integer a little-endian
// uint64:
//   len(name), name bytes, len(dtype name), dtype name bytes (e.g. "f32"),
//   ndim, each dim, byte size, the tensor's bytes (row-major, little-endian elements).
// Length prefixes make the byte sequence unambiguous (no two different tensor lists give the same
// sequence).
uint64_t model_hash(const std::vector<TensorRef>& tensors);
uint64_t model_hash(const Checkpoint& ckpt);

// The same digest taken one tensor at a time, for tensors that are never all in memory at once:
// add() them in model_hash's order (a tensor whose name is not a parameter's is skipped).
class ModelHasher {
 public:
  void add(const TensorRef& t);
  uint64_t digest() const;

 private:
  Hasher hasher_;
};

}  // namespace lockstep::ckpt
