// Tensor dumps: a run directory that numpy opens with no project code, and its reader.
//
// Layout of a dump directory:
//   manifest.json        {"format": "lockstep-dump", "version": 1, "config": RunConfig::to_json(),
//                         "layout": {...}, "tensors": [{name, step, dtype, shape, file, xxh64}, ...]}
//   step_<N>/<key>.npy   one numpy file per tensor and step (format 1.0, '<f4', C order, header
//                        padded to a multiple of 64 bytes); <key> is the hook name with '/' -> '.'
// Names are `step/<N>/<hook name>` with N the 0-based optimizer step: activations and their
// gradients (`step/3/layer/1/attn/qkv`, `step/3/grad/logits`) with the step's micro-batches
// concatenated along dim 0 (the whole global batch), `step/3/loss` (a scalar, the step's mean
// loss), `step/3/grad/param/<name>` (the parameter gradient after reduction, before clipping) and
// `step/3/param/<name>` (the parameter after the update). Tensors are listed in execution order.
// Every file is written atomically and the manifest is rewritten after each dumped step, so a
// killed run leaves a readable dump of the steps it finished. xxh64 covers the payload bytes only.
//
// Tensor parallelism: given the tp group (and the model config and sequence-parallel flag that
// say how each hook tensor is split, src/model/hook_layout.hpp), end_step() first gathers every
// batch tensor's shards to tp rank 0, which assembles the global tensor one device observes.
// Whole tensors (loss, parameters, parameter gradients) are add()ed global by the caller.
//
// Context parallelism: given the cp group, every batch tensor's token dimension (dim 1; the query
// dimension, dim 2, of attention probabilities) holds this rank's positions of each sequence, block
// by block (src/model/modules.hpp's SeqBlock order within each micro-batch); end_step() gathers the
// cp ranks' parts to cp rank 0, which puts every position in its place (before the tp gather, which
// cp rank 0's tp group then does).
//
// Data parallelism: given the dp group, each rank observes its own part of the global batch and
// end_step() gathers every batch tensor to dp rank 0, concatenated along dim 0 in dp rank order,
// which is global order (rank r holds the global sequences [r·B/dp, (r+1)·B/dp), as the trainer
// samples them); under tensor parallelism the tp rank 0 of each replica takes part. The rank that
// is rank 0 of both groups writes. So a dump of a dp × tp (× sp) run holds the same global tensors,
// in the same order and shapes, as a single-process dump of the same batch.
//
// The writer is header-only on purpose: the trainer (lockstep_train) uses it, and lockstep_verify
// links lockstep_train, not the other way round. The reader is in dump.cpp.
// Not here: bf16/fp8 payloads (everything dumped is fp32 today), bisect.
#pragma once

#include <fnmatch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm/communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"
#include "src/model/config.hpp"
#include "src/model/hook_layout.hpp"
#include "src/model/modules.hpp"

namespace lockstep::verify {

inline constexpr const char* kDumpFormat = "lockstep-dump";
inline constexpr int kDumpVersion = 1;

// The bytes of a numpy format 1.0 header for a little-endian fp32 C-order array: magic, version,
// header length, the dict, space padding and '\n', the total a multiple of 64.
inline std::string npy_header_f32(std::span<const int64_t> shape) {
  std::string tuple;  // Python's repr: (), (4,), (2, 3)
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) tuple += ", ";
    tuple += std::to_string(shape[i]);
  }
  if (shape.size() == 1) tuple += ",";
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + tuple + "), }";
  const size_t unpadded = 10 + dict.size() + 1;  // magic(6) version(2) length(2) dict '\n'
  const size_t total = (unpadded + 63) / 64 * 64;
  dict.append(total - unpadded, ' ');
  dict += '\n';
  const auto len = static_cast<uint16_t>(dict.size());
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  return out + dict;
}

// Writes `data` (shape `shape`, C order) to `path` as .npy, atomically; returns xxh64 of the payload.
inline uint64_t write_npy_f32(const std::string& path, const float* data, std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const std::string header = npy_header_f32(shape);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  durable_io::AtomicFile f(path);
  f.write(header.data(), header.size());
  f.write(data, bytes);  // x86-64 and aarch64 Linux are little-endian: the '<f4' bytes as stored
  f.commit();
  return xxh64(data, bytes);
}

// "0-20", "3,7,10-12"; "" = every step. ConfigError naming `what` on anything else.
class StepSet {
 public:
  StepSet() = default;
  StepSet(const std::string& spec, const std::string& what) {
    size_t start = 0;
    while (start <= spec.size() && !spec.empty()) {
      const size_t comma = std::min(spec.find(',', start), spec.size());
      const std::string item = spec.substr(start, comma - start);
      const size_t dash = item.find('-');
      auto number = [&](const std::string& t) -> int64_t {
        LS_REQUIRE(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos, what,
                   ": expected steps like \"0-20\" or \"3,7,10-12\", got \"", spec, "\"");
        return std::stoll(t);
      };
      const int64_t lo = number(item.substr(0, dash));
      const int64_t hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
      LS_REQUIRE(lo <= hi, what, ": range ", item, " is empty (first step after last)");
      ranges_.emplace_back(lo, hi);
      start = comma + 1;
    }
  }
  bool contains(int64_t step) const {
    if (ranges_.empty()) return true;
    for (const auto& [lo, hi] : ranges_) {
      if (step >= lo && step <= hi) return true;
    }
    return false;
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

// Comma-separated glob patterns over hook names ('*' also matches '/'); "" = every tensor.
class NameFilter {
 public:
  NameFilter() = default;
  explicit NameFilter(const std::string& spec) {
    size_t start = 0;
    while (start < spec.size()) {
      const size_t comma = std::min(spec.find(',', start), spec.size());
      if (comma > start) patterns_.push_back(spec.substr(start, comma - start));
      start = comma + 1;
    }
  }
  bool matches(std::string_view name) const {
    if (patterns_.empty()) return true;
    const std::string n(name);
    for (const auto& p : patterns_) {
      if (fnmatch(p.c_str(), n.c_str(), 0) == 0) return true;
    }
    return false;
  }

 private:
  std::vector<std::string> patterns_;
};

// Tensor parallelism as the dump needs it: the group, and what says how hook tensors split over it.
struct DumpTp {
  comm::Communicator* group = nullptr;  // nullptr or a group of one: no tensor parallelism
  const ModelDesc* model = nullptr;     // the model's layer list (it must outlive the writer)
  bool sequence_parallel = false;
};

// Context parallelism as the dump needs it: the group, and every rank's blocks of positions.
struct DumpCp {
  comm::Communicator* group = nullptr;        // nullptr or a group of one: no context parallelism
  std::vector<std::vector<SeqBlock>> blocks;  // cp rank r's blocks of [0, T)
};

// Collects one step's tensors (micro-batches concatenated along dim 0) and writes them at end_step().
class DumpWriter {
 public:
  // `dir` must not hold a dump already (ConfigError, on every rank); it is created if absent.
  // dp: the data-parallel group this rank belongs to (nullptr: one process); it must outlive the
  // writer, and every rank of it must construct a writer with the same tensors and steps and call
  // begin_step/end_step for the same steps (end_step is collective). tp: likewise for the tp group.
  // pp: the pipeline group (nullptr or a group of one: no stages); each stage's writer writes its
  // stage's tensors and pipeline rank 0 the manifest of all of them.
  // cp: the context-parallel group and blocks (every micro-batch's tensors then hold
  // `micro_batch` sequences).
  DumpWriter(std::string dir, const std::string& tensors, const std::string& steps, nlohmann::json config,
             nlohmann::json layout, comm::Communicator* dp = nullptr, DumpTp tp = {}, comm::Communicator* pp = nullptr,
             DumpCp cp = {}, int64_t micro_batch = 0)
      : dir_(std::move(dir)),
        filter_(tensors),
        steps_(steps, "[dump] steps"),
        dp_(dp),
        tp_(std::move(tp)),
        pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
        cp_(std::move(cp)),
        micro_batch_(micro_batch) {
    LS_REQUIRE(!durable_io::exists(dir_ + "/manifest.json"), "[dump] dir: ", dir_,
               " already holds a dump (manifest.json); choose another dir or remove it");
    if (writes()) durable_io::make_dirs(dir_);
    manifest_ = {{"format", kDumpFormat}, {"version", kDumpVersion}, {"config", std::move(config)},
                 {"layout", std::move(layout)}, {"tensors", nlohmann::json::array()}};
  }

  bool wants_step(int64_t step) const { return steps_.contains(step); }
  bool wants(std::string_view name) const { return filter_.matches(name); }
  // Whether step `step` dumps any of `names` (the same answer on every rank: a caller may base a
  // collective on it).
  bool wants_any(int64_t step, const std::vector<std::string>& names) const {
    return wants_step(step) && std::any_of(names.begin(), names.end(), [&](const auto& n) { return wants(n); });
  }

  // Between begin_step and end_step, observe() collects; outside (evaluation) it ignores.
  void begin_step(int64_t step) {
    step_ = step;
    active_ = wants_step(step);
    pending_.clear();
    order_.clear();
  }

  // The model's hook: appends one micro-batch's tensor (B_micro, ...) to the step's tensor.
  void observe(std::string_view name, const float* data, std::span<const int64_t> shape) {
    if (!active_ || !wants(name)) return;
    auto [it, fresh] = pending_.try_emplace(std::string(name));
    Pending& p = it->second;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (fresh) {
      order_.push_back(it->first);
      p.shape.assign(shape.begin(), shape.end());
      p.batch = true;
    } else {
      LS_CHECK(!shape.empty() && shape.size() == p.shape.size() &&
                   std::equal(shape.begin() + 1, shape.end(), p.shape.begin() + 1),
               "micro-batches of ", name, " disagree in shape");
      p.shape[0] += shape[0];
    }
    p.data.insert(p.data.end(), data, data + n);
  }

  // Whole tensors known once per step (loss, parameter gradients, parameters).
  void add(std::string_view name, const float* data, std::vector<int64_t> shape) {
    if (!active_ || !wants(name)) return;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto [it, fresh] = pending_.try_emplace(std::string(name));
    LS_CHECK(fresh, "tensor ", name, " added twice in one step");
    order_.push_back(it->first);
    it->second.shape = std::move(shape);
    it->second.data.assign(data, data + n);
  }

  // Gathers the step's batch tensors over the tp group, then over the dp group (collectives), then
  // the writing rank writes the step's tensors and the manifest. With pipeline stages every stage's
  // writer writes its own tensors and sends their entries to pipeline rank 0, which lists them in
  // execution order — the forward tensors stage by stage, then the gradients from the last stage
  // back — followed by its whole tensors (equal on every stage), and writes the manifest.
  void end_step() {
    if (!active_) return;
    active_ = false;
    // Positions first: a part's blocks are whole rows only before the tp shards are placed.
    if (cp_size() > 1) gather_positions();
    if (tp_size() > 1 && cp_rank() == 0) gather_tp_shards();
    if (dp_ != nullptr && dp_->size() > 1 && tp_rank() == 0 && cp_rank() == 0) gather_batch_tensors();
    if (!writes() || (order_.empty() && pp_ == nullptr)) {
      pending_.clear();
      order_.clear();
      return;
    }
    const std::string sub = "step_" + std::to_string(step_);
    durable_io::make_dirs(dir_ + "/" + sub);
    nlohmann::json forward = nlohmann::json::array(), backward = nlohmann::json::array(),
                   whole = nlohmann::json::array();
    for (const auto& name : order_) {
      const Pending& p = pending_.at(name);
      if (!p.batch && pp_ != nullptr && pp_->rank() != 0) continue;  // pipeline rank 0 writes them
      std::string key = name;
      for (char& c : key) c = c == '/' ? '.' : c;
      const std::string file = sub + "/" + key + ".npy";
      const uint64_t h = write_npy_f32(dir_ + "/" + file, p.data.data(), p.shape);
      nlohmann::json entry = {{"name", "step/" + std::to_string(step_) + "/" + name},
                              {"step", step_},
                              {"dtype", "float32"},
                              {"shape", p.shape},
                              {"file", file},
                              {"xxh64", hex64(h)}};
      (!p.batch ? whole : name.rfind("grad/", 0) == 0 ? backward : forward).push_back(std::move(entry));
    }
    pending_.clear();
    order_.clear();
    if (pp_ != nullptr) {
      const nlohmann::json mine = {forward, backward, whole};
      const std::vector<std::string> stages = pp_->all_gather_text(mine.dump());
      if (pp_->rank() != 0) return;
      forward = backward = whole = nlohmann::json::array();
      for (size_t s = 0; s < stages.size(); ++s) {
        const nlohmann::json f = nlohmann::json::parse(stages[s])[0];
        const nlohmann::json b = nlohmann::json::parse(stages[stages.size() - 1 - s])[1];
        forward.insert(forward.end(), f.begin(), f.end());
        backward.insert(backward.end(), b.begin(), b.end());
      }
      whole = nlohmann::json::parse(stages[0])[2];
    }
    for (const nlohmann::json* part : {&forward, &backward, &whole}) {
      for (const nlohmann::json& entry : *part) manifest_["tensors"].push_back(entry);
    }
    durable_io::write_file_atomic(dir_ + "/manifest.json", manifest_.dump(1) + "\n");
  }

 private:
  struct Pending {
    std::vector<int64_t> shape;
    std::vector<float> data;
    bool batch = false;  // observed per micro-batch (dim 0 = sequences), not add()ed whole
  };

  int tp_size() const { return tp_.group == nullptr ? 1 : tp_.group->size(); }
  int tp_rank() const { return tp_.group == nullptr ? 0 : tp_.group->rank(); }
  int cp_size() const { return cp_.group == nullptr ? 1 : cp_.group->size(); }
  int cp_rank() const { return cp_.group == nullptr ? 0 : cp_.group->rank(); }
  bool writes() const { return (dp_ == nullptr || dp_->rank() == 0) && tp_rank() == 0 && cp_rank() == 0; }

  // Every cp rank's part of each batch tensor goes to cp rank 0, which puts each of its positions
  // in place. Per micro-batch of S sequences a part is, block after block, (S, mid..., length,
  // rest...) with the positions at dim `at` (1; 2 for the attention probabilities, whose dim 1 is
  // the heads); the global tensor is (S, mid..., T, rest...).
  void gather_positions() {
    comm::Communicator& cp = *cp_.group;
    constexpr int kTag = 7303;  // cp position gathers; distinct from the tp and dp gathers' tags
    int64_t T = 0;
    for (const SeqBlock& k : cp_.blocks[0]) T += k.length * cp.size();
    std::vector<float> part;
    for (const auto& name : order_) {
      Pending& p = pending_.at(name);
      if (!p.batch) continue;
      const size_t at = name.ends_with("attn/att") ? 2 : 1;
      LS_CHECK(p.shape.size() > at && p.shape[0] % micro_batch_ == 0, "[dump]: ", name, " has no position dimension");
      if (cp.rank() != 0) {
        cp.send(p.data.data(), static_cast<int64_t>(p.data.size()), DType::kF32, 0, kTag);
        continue;
      }
      int64_t mid = 1, rest = 1;
      for (size_t d = 1; d < at; ++d) mid *= p.shape[d];
      for (size_t d = at + 1; d < p.shape.size(); ++d) rest *= p.shape[d];
      const int64_t micros = p.shape[0] / micro_batch_, held = p.shape[at];
      std::vector<float> global(static_cast<size_t>(p.shape[0] * mid * T * rest));
      part = p.data;
      for (int r = 0; r < cp.size(); ++r) {
        if (r > 0) cp.recv(part.data(), static_cast<int64_t>(part.size()), DType::kF32, r, kTag);
        const float* from = part.data();
        for (int64_t m = 0; m < micros; ++m) {
          for (const SeqBlock& k : cp_.blocks[static_cast<size_t>(r)]) {
            for (int64_t s = 0; s < micro_batch_ * mid; ++s, from += k.length * rest) {
              const int64_t seq_row = m * micro_batch_ * mid + s;  // (sequence, mid) row of the global tensor
              std::copy_n(from, k.length * rest, global.data() + (seq_row * T + k.position) * rest);
            }
          }
        }
        LS_CHECK(from == part.data() + part.size() && held * cp.size() == T, "[dump]: ", name,
                 " does not hold this rank's positions");
      }
      p.data = std::move(global);
      p.shape[at] = T;
    }
  }

  // Every tp rank's shard of each batch tensor goes to tp rank 0, which places it in the global
  // tensor where hook_shard says it lies (each rank's shard has the same local shape, so rank 0
  // works out every rank's place itself). Tensors every rank holds whole stay as they are.
  void gather_tp_shards() {
    comm::Communicator& tp = *tp_.group;
    const auto mine = static_cast<int64_t>(order_.size());
    for (int64_t n : tp.all_gather(mine)) {
      LS_CHECK(n == mine, "[dump]: tp ranks observed different numbers of tensors in step ", step_, " (", n,
               " vs ", mine, ")");
    }
    constexpr int kTag = 7302;  // tp shard gathers; distinct from the dp gather's tag
    std::vector<float> shard;
    for (const auto& name : order_) {
      Pending& p = pending_.at(name);
      if (!p.batch) continue;
      const HookShard own = hook_shard(*tp_.model, {tp.size(), tp.rank()}, tp_.sequence_parallel, name, p.shape);
      if (own.whole()) continue;
      if (tp.rank() != 0) {
        tp.send(p.data.data(), static_cast<int64_t>(p.data.size()), DType::kF32, 0, kTag);
        continue;
      }
      const std::vector<int64_t> global_shape = global_hook_shape(own, p.shape);
      std::vector<float> global(p.data.size() * static_cast<size_t>(tp.size()));
      place_hook_shard(own, p.shape, p.data.data(), global.data());
      shard.resize(p.data.size());
      for (int r = 1; r < tp.size(); ++r) {
        tp.recv(shard.data(), static_cast<int64_t>(shard.size()), DType::kF32, r, kTag);
        place_hook_shard(hook_shard(*tp_.model, {tp.size(), r}, tp_.sequence_parallel, name, p.shape), p.shape,
                         shard.data(), global.data());
      }
      p.data = std::move(global);
      p.shape = global_shape;
    }
  }

  // Rank r > 0 sends each batch tensor (in the step's execution order, the same on every rank) to
  // rank 0, which appends them in rank order. Whole tensors (add) are equal on every rank after
  // the gradient reduction; rank 0 keeps its own.
  void gather_batch_tensors() {
    const auto mine = static_cast<int64_t>(order_.size());
    for (int64_t n : dp_->all_gather(mine)) {
      LS_CHECK(n == mine, "[dump]: dp ranks observed different numbers of tensors in step ", step_, " (", n,
               " vs ", mine, ")");
    }
    constexpr int kTag = 7301;  // dump gathers; distinct from the trainer's own point-to-point tags
    for (const auto& name : order_) {
      Pending& p = pending_.at(name);
      if (!p.batch) continue;
      const std::vector<int64_t> rows = dp_->all_gather(p.shape.empty() ? int64_t{0} : p.shape[0]);
      const int64_t row = p.shape.empty() || p.shape[0] == 0 ? 0 : static_cast<int64_t>(p.data.size()) / p.shape[0];
      for (int64_t r : dp_->all_gather(row)) {
        LS_CHECK(r == row || r == 0 || row == 0, "[dump]: dp ranks disagree on the row size of ", name, " (", r,
                 " vs ", row, " elements)");
      }
      if (dp_->rank() != 0) {
        dp_->send(p.data.data(), static_cast<int64_t>(p.data.size()), DType::kF32, 0, kTag);
        continue;
      }
      for (int r = 1; r < dp_->size(); ++r) {
        const size_t at = p.data.size();
        p.data.resize(at + static_cast<size_t>(rows[r] * row));
        dp_->recv(p.data.data() + at, rows[r] * row, DType::kF32, r, kTag);
        p.shape[0] += rows[r];
      }
    }
  }

  std::string dir_;
  NameFilter filter_;
  StepSet steps_;
  comm::Communicator* dp_ = nullptr;
  DumpTp tp_;
  comm::Communicator* pp_ = nullptr;  // the pipeline group (nullptr: no stages)
  DumpCp cp_;
  int64_t micro_batch_ = 0;
  nlohmann::json manifest_;
  int64_t step_ = 0;
  bool active_ = false;
  std::map<std::string, Pending> pending_;
  std::vector<std::string> order_;  // first-seen (execution) order
};

// One tensor of a dump as the manifest lists it.
struct DumpEntry {
  std::string name;  // step/17/layer/3/attn/qkv
  int64_t step = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string file;  // relative to the dump directory
  std::string xxh64;
};

struct Dump {
  std::string dir;
  nlohmann::json manifest;
  std::vector<DumpEntry> entries;  // execution order
};

// Reads `dir`/manifest.json; DataError naming the file if it is missing, not JSON, of another
// format or version, or lacks a field.
Dump read_dump(const std::string& dir);

// Reads a '<f4' C-order .npy file; DataError naming the file on a bad magic, version, dtype, order
// or a truncated payload. Returns the data and stores the shape.
std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>& shape);

// An entry's data, checked against the manifest (shape and xxh64): DataError naming the file.
std::vector<float> load_entry(const Dump& dump, const DumpEntry& e);

}  // namespace lockstep::verify
