#include "src/train/checkpointing.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/parallel/tensor_parallel.hpp"
#include "src/train/checkpoint_interval.hpp"

namespace lockstep {

namespace {

// Parameters and (if m and v are given) optimizer state as checkpoint tensors, in canonical order:
// whole (global) tensors laid out as `layout` (the tp = 1 layout).
std::vector<ckpt::TensorRef> state_tensors(const std::vector<ParamTensor>& layout, const float* params,
                                           const float* m, const float* v) {
  std::vector<ckpt::TensorRef> refs;
  for (const auto& p : layout) refs.push_back({ckpt::kModelPrefix + p.name, DType::kF32, p.shape, params + p.offset});
  if (m != nullptr) {
    for (const auto& p : layout) {
      refs.push_back({"optim/m/" + p.name, DType::kF32, p.shape, m + p.offset});
      refs.push_back({"optim/v/" + p.name, DType::kF32, p.shape, v + p.offset});
    }
  }
  return refs;
}

// A checkpoint can continue this run only if everything that shapes the trajectory matches.
void check_resumable(const std::string& dir, const nlohmann::json& state, const RunConfig& cfg) {
  const nlohmann::json now = cfg.to_json();
  const nlohmann::json& then = state.at("config");
  const std::string model = model_config_difference(then, now, "this run");
  LS_REQUIRE(model.empty(), dir, ": cannot resume: it was written with [model] ", model,
             " (use another [checkpoint] dir, or the same config)");
  // A key a checkpoint predates had its default then (fp32 throughout).
  const nlohmann::json defaults = RunConfig{}.to_json()["train"];
  for (const char* key : {"batch_size", "mode", "seed", "precision", "fp32_linears", "master_weights"}) {
    const nlohmann::json was = then["train"].contains(key) ? then["train"][key] : defaults[key];
    LS_REQUIRE(was == now["train"][key], dir, ": cannot resume: it was written with [train] ", key, " = ",
               was.dump(), ", this run has ", now["train"][key].dump());
  }
  // An fp8 run's recipe and formats decide what its scales mean; the rest (margin, history
  // length, which GEMMs) may change on resume.
  if (now["train"]["precision"] == "fp8") {
    const nlohmann::json fp8_defaults = RunConfig{}.to_json()["fp8"];
    for (const char* key : {"recipe", "format"}) {
      const nlohmann::json was = then.contains("fp8") && then["fp8"].contains(key) ? then["fp8"][key] : fp8_defaults[key];
      LS_REQUIRE(was == now["fp8"][key], dir, ": cannot resume: it was written with [fp8] ", key, " = ", was.dump(),
                 ", this run has ", now["fp8"][key].dump());
    }
  }
}

// The elements [first, end) of this rank's tensor-parallel slice of p, as a checkpoint places them.
ckpt::ShardPlace slice_place(const ParamTensor& p, int64_t first, int64_t end) {
  return {p.replicated() ? -1 : p.split_dim, p.ranges, first, end};
}

}  // namespace

ckpt::ShardPlace SavedPiece::place() const { return slice_place(*tensor, first, end); }

std::vector<SavedPiece> saved_pieces(const std::vector<ParamTensor>& layout, int64_t zero, int64_t dp,
                                     int64_t dp_rank, TpCoord tp, EpCoord ep) {
  const int64_t n = layout.empty() ? 0 : layout.back().offset + layout.back().numel;
  int64_t first = dp_rank * n / dp, end = (dp_rank + 1) * n / dp;
  if (zero > 0) {
    const parallel::ShardPlan plan = parallel::make_shard_plan(layout, static_cast<int>(dp));
    first = plan.first(static_cast<int>(dp_rank));
    end = plan.end(static_cast<int>(dp_rank));
  }
  std::vector<SavedPiece> pieces;
  for (const ParamTensor& p : layout) {
    int64_t lo = std::max(first, p.offset), hi = std::min(end, p.offset + p.numel);
    // The ranks holding the same piece (over tp where it is replicated, over ep where it is not
    // an expert's) write one part each.
    const int64_t tp_size = p.replicated() ? tp.size : 1, tp_rank = p.replicated() ? tp.rank : 0;
    const int64_t holders = tp_size * (p.is_expert() ? 1 : ep.size);
    const int64_t me = (p.is_expert() ? 0 : ep.rank) * tp_size + tp_rank;
    if (holders > 1 && lo < hi) {
      std::tie(lo, hi) = std::pair{lo + me * (hi - lo) / holders, lo + (me + 1) * (hi - lo) / holders};
    }
    if (lo < hi) pieces.push_back({&p, lo - p.offset, hi - p.offset});
  }
  return pieces;
}

namespace {

// Where this rank's AdamW moments start in its flat slice: its ZeRO shard's first element, or 0
// where it holds them all (zero 0).
int64_t moments_first(const TrainRun& run) { return run.cfg.parallel.zero > 0 ? run.ddp.shard_first() : 0; }

// Where this rank's parameters start in its flat slice: its ZeRO-3 shard's first element, or 0
// where it holds them all.
int64_t params_first(const TrainRun& run) { return run.ddp.sharded_params() ? run.ddp.shard_first() : 0; }

// What this rank holds, read from a checkpoint: its tensor-parallel slice of the parameters (under
// ZeRO-3 its shard of it) and, of the AdamW moments, its ZeRO shard (or the whole slice without
// ZeRO) — only those bytes.
struct LocalState {
  std::vector<float> params, m, v;
};

LocalState read_local(TrainRun& run, ckpt::CheckpointReader& reader) {
  LocalState s;
  s.params.resize(run.held_params().size());
  s.m.resize(run.ddp.moments_m().size());
  s.v.resize(s.m.size());
  const int64_t first = moments_first(run), end = first + static_cast<int64_t>(s.m.size());
  const int64_t p_first = params_first(run), p_end = p_first + static_cast<int64_t>(s.params.size());
  for (const ParamTensor& p : run.model.param_layout()) {
    if (const int64_t lo = std::max(p_first, p.offset), hi = std::min(p_end, p.offset + p.numel); lo < hi) {
      reader.read(ckpt::kModelPrefix + p.name, DType::kF32, p.global_shape, slice_place(p, lo - p.offset, hi - p.offset),
                  s.params.data() + (lo - p_first));
    }
    const int64_t lo = std::max(first, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const ckpt::ShardPlace part = slice_place(p, lo - p.offset, hi - p.offset);
    reader.read("optim/m/" + p.name, DType::kF32, p.global_shape, part, s.m.data() + (lo - first));
    reader.read("optim/v/" + p.name, DType::kF32, p.global_shape, part, s.v.data() + (lo - first));
  }
  return s;
}

// What this rank writes of a sharded save (with every other rank's, each element once).
std::vector<SavedPiece> own_pieces(const TrainRun& run) {
  const EpCoord ep = run.expert_parallel() ? EpCoord{run.ep->size(), run.ep->rank()} : EpCoord{};
  return saved_pieces(run.model.param_layout(), run.cfg.parallel.zero, run.dp.size(), run.dp.rank(),
                      {run.tp.size(), run.tp.rank()}, ep);
}

// Where a piece's parameters lie in what this rank holds.
const float* piece_params(const TrainRun& run, const SavedPiece& piece) {
  return run.held_params().data() + (piece.tensor->offset + piece.first - params_first(run));
}

// The shards this rank writes (saved_pieces), pointing into its parameters and moments.
std::vector<ckpt::ShardRef> own_shards(TrainRun& run) {
  std::vector<ckpt::ShardRef> shards;
  const int64_t m0 = moments_first(run);
  const float* m = run.ddp.moments_m().data();
  const float* v = run.ddp.moments_v().data();
  for (const SavedPiece& piece : own_pieces(run)) {
    const ParamTensor& p = *piece.tensor;
    const int64_t lo = p.offset + piece.first;
    const ckpt::ShardPlace where = piece.place();
    shards.push_back({ckpt::kModelPrefix + p.name, DType::kF32, p.global_shape, where, piece_params(run, piece)});
    shards.push_back({"optim/m/" + p.name, DType::kF32, p.global_shape, where, m + (lo - m0)});
    shards.push_back({"optim/v/" + p.name, DType::kF32, p.global_shape, where, v + (lo - m0)});
  }
  return shards;
}

// The first error of any rank of `comm` ("" when none failed; `mine` is this rank's), the same on
// every rank: the ranks then stop or skip together, and the error is printed once.
std::string first_error(comm::Communicator& comm, const std::string& mine) {
  for (const std::string& e : comm.all_gather_text(mine)) {
    if (!e.empty()) return e;
  }
  return "";
}

}  // namespace

Resumed resume(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  if (cfg.checkpoint.dir.empty()) return {};
  comm::Communicator& world = run.world;
  const std::vector<std::string> all = ckpt::list_checkpoints(cfg.checkpoint.dir);
  // The newest checkpoint every rank can read its part of: a rank that meets a missing, truncated
  // or corrupted file skips it for all (the ranks read different bytes), the first such error is
  // printed once, and the next older one is tried.
  for (auto dir = all.rbegin(); dir != all.rend(); ++dir) {
    std::string error;
    std::unique_ptr<ckpt::CheckpointReader> reader;
    LocalState state;
    try {
      reader = std::make_unique<ckpt::CheckpointReader>(*dir);
      check_resumable(*dir, reader->state(), cfg);
      state = read_local(run, *reader);
    } catch (const DataError& e) {
      error = e.what();
    }
    if (const std::string skip = first_error(world, error); !skip.empty()) {
      run.out << "warning: skipping checkpoint " << *dir << ": " << skip << "\n" << std::flush;
      continue;
    }
    std::copy(state.params.begin(), state.params.end(), run.held_params().begin());
    run.held_params_written();
    std::copy(state.m.begin(), state.m.end(), run.ddp.moments_m().begin());
    std::copy(state.v.begin(), state.v.end(), run.ddp.moments_v().begin());
    const nlohmann::json& saved = reader->state();
    run.sampler.restore(saved.at("sampler").get<data::SamplerState>());
    Resumed r;
    r.step = saved.at("step").get<int64_t>();
    if (saved.contains("observers")) r.observers = saved.at("observers");
    std::ostringstream line;
    line << "resumed from " << *dir << " (step " << r.step << "; rank 0 read " << std::fixed << std::setprecision(1)
         << static_cast<double>(reader->bytes_read()) / 1e6 << " MB of the checkpoint's data)\n";
    run.out << line.str();
    return r;
  }
  return {};
}

void restore_observers(std::span<StepObserver* const> observers, const nlohmann::json& saved) {
  for (StepObserver* o : observers) {
    const std::string key = o->state_key();
    if (!key.empty() && saved.contains(key)) o->restore_state(saved.at(key));
  }
}

struct Checkpointer::Snapshot {
  int64_t step = 0;
  std::string tmp;                         // the checkpoint's temporary directory
  std::vector<ckpt::ShardRef> shards;      // this rank's, into the run's buffers or the snapshot's copy
  // World rank 0's: the manifest's tensors and state, and the model hash where it holds the model.
  std::vector<ckpt::TensorDesc> tensors;
  nlohmann::json layout, state;
  std::string model_hash;
  double stall_s = 0;                      // taking it: the step's cost of an asynchronous save
};

struct Checkpointer::Written {
  int64_t step = 0;
  std::string dir, error;
  size_t files = 0;
  uint64_t total = 0, largest = 0;
  double seconds = 0;  // writing, from the snapshot to the renamed directory
  double stall_s = 0;
  bool async = false;
};

struct Checkpointer::InFlight {
  std::thread thread;
  std::atomic<bool> done{false};
  Written written;
  bool reported = false;
};

Checkpointer::Checkpointer(TrainRun& run, const std::vector<StepObserver*>& observers)
    : run_(run), observers_(observers) {
  const CheckpointConfig& c = run.cfg.checkpoint;
  if (c.dir.empty() || !c.async) return;
  LS_REQUIRE(run.world.concurrent_threads(), run.cfg.source,
             ": [checkpoint] async needs an MPI library with MPI_THREAD_MULTIPLE, which this one does not provide");
  writer_comm_ = run.world.split(0, run.world.rank(), "checkpoint writer");
}

Checkpointer::~Checkpointer() {
  if (in_flight_ && in_flight_->thread.joinable()) in_flight_->thread.join();
}

void Checkpointer::end_step(const StepRecord& r) {
  const CheckpointConfig& c = run_.cfg.checkpoint;
  // A save written since the last step: its line now (rank 0 only; an error waits for the
  // collective landing below, so that every rank meets it at the same step).
  if (in_flight_ && !in_flight_->reported && in_flight_->done.load() && in_flight_->written.error.empty()) {
    report(in_flight_->written);
    in_flight_->reported = true;
  }
  step_seconds_ += r.seconds;
  ++steps_timed_;
  const bool due = c.every_auto ? due_auto(r.done()) : c.every > 0 && r.done() % c.every == 0;
  if (c.dir.empty() || !(r.last || r.stopping || due)) return;
  last_saved_ = r.done();
  if (!c.async) {
    const Written w = write(snapshot(r.done(), r.loss, false), run_.world);
    if (!w.error.empty()) throw DataError(w.error);
    report(w);
    if (c.every_auto) update_interval(w.stall_s + w.seconds);
    return;
  }
  if (in_flight_) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t previous = in_flight_->written.step;
    const bool was_done = in_flight_->done.load();
    land_in_flight();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!was_done && run_.world.rank() == 0) {
      std::ostringstream line;
      line << "checkpoint: step " << r.done() << "'s save waited " << std::fixed << std::setprecision(2) << waited
           << " s for step " << previous << "'s to land (one save in flight at a time)\n";
      run_.out << line.str();
    }
  }
  in_flight_ = std::make_unique<InFlight>();
  InFlight& f = *in_flight_;
  f.written.step = r.done();
  auto s = std::make_shared<Snapshot>(snapshot(r.done(), r.loss, true));
  if (c.every_auto) update_interval(s->stall_s);
  f.thread = std::thread([this, s, &f] {
    f.written = write(*s, *writer_comm_);
    f.done.store(true);
  });
  // The run's last checkpoint lands before the run ends.
  if (r.last || r.stopping) land_in_flight();
}

bool Checkpointer::due_auto(int64_t done) const {
  if (auto_every_ == 0) return done == last_saved_ + 1;  // the first step of the run: measure a save
  return done - last_saved_ >= auto_every_;
}

void Checkpointer::update_interval(double stall_s) {
  const double mtbf_s = run_.cfg.checkpoint.mtbf_hours * 3600;
  const double step_s = step_seconds_ / static_cast<double>(std::max<int64_t>(steps_timed_, 1));
  int64_t every = checkpoint_interval_steps(stall_s, mtbf_s, step_s);
  run_.world.broadcast(&every, 1, DType::kI64, 0);
  if (every == auto_every_) return;
  auto_every_ = every;
  if (run_.world.rank() != 0) return;
  std::ostringstream line;
  line << "checkpoint interval: every " << every << (every == 1 ? " step" : " steps") << " (Daly's optimum for a save "
       << "stall of " << std::setprecision(3) << stall_s << " s, a mean time between failures of "
       << run_.cfg.checkpoint.mtbf_hours << " h and a step of " << step_s << " s: " << daly_interval_s(stall_s, mtbf_s)
       << " s of training between saves)\n";
  run_.out << line.str();
}

void Checkpointer::land_in_flight() {
  if (!in_flight_) return;
  in_flight_->thread.join();
  const Written w = in_flight_->written;
  const bool reported = in_flight_->reported;
  in_flight_.reset();
  if (!w.error.empty()) throw DataError(w.error);
  if (!reported) report(w);
}

Checkpointer::Snapshot Checkpointer::snapshot(int64_t step_done, float loss, bool copy) {
  const auto started = std::chrono::steady_clock::now();
  const RunConfig& cfg = run_.cfg;
  const ParallelConfig& pc = cfg.parallel;
  comm::Communicator& world = run_.world;
  Snapshot s;
  s.step = step_done;
  // World rank 0 opens the checkpoint's temporary directory; every rank writes its own shards
  // there (no rank gathers another's tensors); rank 0 writes the manifest once every file is
  // durable, and renames.
  std::string error;
  if (world.rank() == 0) {
    try {
      s.tmp = ckpt::begin_save(cfg.checkpoint.dir, step_done);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  if (const std::string e = first_error(world, error); !e.empty()) throw DataError(e);
  s.tmp = world.broadcast_text(s.tmp, 0);
  s.shards = own_shards(run_);
  if (copy) {
    size_t floats = 0;
    for (const ckpt::ShardRef& r : s.shards) floats += static_cast<size_t>(r.place.end - r.place.first);
    snapshot_buffer_.resize(floats);
    float* at = snapshot_buffer_.data();
    for (ckpt::ShardRef& r : s.shards) {
      const auto n = static_cast<size_t>(r.place.end - r.place.first);
      std::memcpy(at, r.data, n * sizeof(float));
      r.data = at;
      at += n;
    }
  }
  if (world.rank() == 0) {
    for (const char* prefix : kStatePrefixes) {
      for (const ParamTensor& p : run_.global_layout) s.tensors.push_back({prefix + p.name, DType::kF32, p.shape});
    }
    const int pp = run_.pipelined() ? run_.pp->size() : 1;
    const int cp = run_.context_parallel() ? run_.cp->size() : 1;
    const int dp = run_.dp.size() / cp;  // run_.dp is dp x cp
    nlohmann::json layout = {{"dp", dp}, {"tp", run_.tp.size()}, {"pp", pp}, {"sp", pc.sp},
                             {"zero", pc.zero}, {"reduce", pc.reduce}};
    if (run_.expert_parallel()) layout["ep"] = run_.ep->size();
    if (cp > 1) layout["cp"] = cp;
    if (run_.tensor_parallel()) layout["tp_shards"] = parallel::describe_shards(cfg.model, run_.tp.size());
    nlohmann::json observers = nlohmann::json::object();
    for (const StepObserver* o : observers_) {
      if (!o->state_key().empty()) observers[o->state_key()] = o->save_state();
    }
    s.state = {{"step", step_done}, {"sampler", run_.sampler.state()}, {"config", cfg.to_json()},
               {"layout", layout},  {"loss", loss}, {"observers", observers}};
    s.layout = {{"dp", dp}, {"tp", run_.tp.size()}, {"pp", pp}};
    if (run_.expert_parallel()) s.layout["ep"] = run_.ep->size();
    if (cp > 1) s.layout["cp"] = cp;
    // Without tensor, pipeline or expert parallelism or ZeRO-3 rank 0 holds every parameter whole
    // and can hash the model.
    if (!run_.tensor_parallel() && !run_.pipelined() && !run_.expert_parallel() && run_.model.params() != nullptr) {
      s.model_hash = hex64(ckpt::model_hash(state_tensors(run_.global_layout, run_.model.params(), nullptr, nullptr)));
    }
  }
  s.stall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return s;
}

Checkpointer::Written Checkpointer::write(const Snapshot& s, comm::Communicator& comm) const {
  const auto started = std::chrono::steady_clock::now();
  const CheckpointConfig& c = run_.cfg.checkpoint;
  Written w;
  w.step = s.step;
  w.stall_s = s.stall_s;
  w.async = &comm != &run_.world;
  std::string record, error;
  try {
    if (!s.shards.empty()) record = ckpt::write_shards(s.tmp, run_.world.rank(), s.shards).dump();
  } catch (const InputError& e) {
    error = e.what();
  }
  w.error = first_error(comm, error);
  if (!w.error.empty()) return w;
  const std::vector<std::string> records = comm.all_gather_text(record);
  if (comm.rank() == 0) {
    std::vector<nlohmann::json> parsed;
    for (const std::string& r : records) {
      if (r.empty()) continue;
      parsed.push_back(nlohmann::json::parse(r));
      const auto bytes = parsed.back().at("file").at("bytes").get<uint64_t>();
      w.total += bytes;
      w.largest = std::max(w.largest, bytes);
    }
    w.files = parsed.size();
    try {
      w.dir = ckpt::finish_save(c.dir, s.step, s.tmp, s.tensors, parsed, s.layout, s.state, s.model_hash,
                                static_cast<int>(c.keep), c.keep_every);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  w.error = first_error(comm, error);
  w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return w;
}

void Checkpointer::report(const Written& w) {
  if (run_.world.rank() != 0) return;
  std::ostringstream line;
  line << "checkpoint " << w.dir << " (" << w.files << (w.files == 1 ? " file, " : " files, ") << std::fixed
       << std::setprecision(1) << static_cast<double>(w.total) / 1e6 << " MB, largest "
       << static_cast<double>(w.largest) / 1e6 << " MB; " << std::setprecision(2);
  // The stall is what the save cost the step: every rank waits for the slowest writer and the
  // manifest, or, asynchronously, for the copy to host memory.
  if (w.async) {
    line << "written in " << w.seconds << " s beside training, the step stalled " << w.stall_s << " s)\n";
  } else {
    line << w.stall_s + w.seconds << " s)\n";
  }
  run_.out << line.str();
  if (on_saved_) on_saved_(w.dir, w.step);
}

namespace {

// One rank's piece of a tensor as world rank 0 reads it: its elements' runs in the whole tensor.
struct HeldPiece {
  int rank = 0;
  int64_t count = 0;
  std::vector<ckpt::PlaceRun> runs;
};

// Every rank's pieces of each tensor of `layout` from their descriptions (one JSON text a rank:
// [name, split_dim, ranges, first, end] a piece, in the order the rank sends them); `problem` says
// what does not cover each tensor's elements exactly once ("" when all do).
std::map<std::string, std::vector<HeldPiece>> held_pieces(const std::vector<std::string>& described,
                                                          const std::vector<ParamTensor>& layout,
                                                          std::string& problem) {
  std::map<std::string, const ParamTensor*> tensors;
  for (const ParamTensor& t : layout) tensors[t.name] = &t;
  std::map<std::string, std::vector<HeldPiece>> held;
  for (size_t r = 0; r < described.size(); ++r) {
    for (const nlohmann::json& d : nlohmann::json::parse(described[r])) {
      const std::string name = d.at(0).get<std::string>();
      const auto t = tensors.find(name);
      if (t == tensors.end()) {
        problem = str_cat("rank ", r, " holds a piece of '", name, "', which the model does not have");
        return held;
      }
      const ckpt::ShardPlace place{d.at(1).get<int>(), d.at(2).get<std::vector<std::pair<int64_t, int64_t>>>(),
                                   d.at(3).get<int64_t>(), d.at(4).get<int64_t>()};
      std::string invalid;
      held[name].push_back({static_cast<int>(r), place.end - place.first, ckpt::place_runs(t->second->shape, place, &invalid)});
      if (!invalid.empty()) {
        problem = str_cat("rank ", r, "'s piece of ", name, ": ", invalid);
        return held;
      }
    }
  }
  for (const ParamTensor& t : layout) {
    std::vector<std::pair<int64_t, int64_t>> covered;
    for (const HeldPiece& piece : held[t.name]) {
      for (const ckpt::PlaceRun& run : piece.runs) covered.emplace_back(run.global, run.global + run.count);
    }
    if (const std::string gap = ckpt::coverage_problem(covered, t.numel, "rank's piece"); !gap.empty()) {
      problem = str_cat(t.name, ": ", gap);
      return held;
    }
  }
  return held;
}

}  // namespace

std::string model_hash(const TrainRun& run) {
  // Each rank's share of the parameters as a sharded save writes it goes to world rank 0 a tensor
  // at a time, in the global order, and rank 0 hashes each whole tensor: the digest of the whole
  // model, with no rank holding more of it than its own share and (rank 0) two copies of a tensor.
  comm::Communicator& world = run.world;
  constexpr int kRoot = 0;
  std::map<std::string, std::vector<const SavedPiece*>> mine;  // by tensor, in the order described
  const std::vector<SavedPiece> pieces = own_pieces(run);
  nlohmann::json described = nlohmann::json::array();
  for (const SavedPiece& piece : pieces) {
    const ckpt::ShardPlace where = piece.place();
    described.push_back({piece.tensor->name, where.split_dim, where.ranges, where.first, where.end});
    mine[piece.tensor->name].push_back(&piece);
  }
  // Checked before any element moves, and the verdict shared: no rank enters a gather the others
  // have left.
  std::string problem;
  const std::vector<std::string> texts = world.gather_text(described.dump(), kRoot);
  std::map<std::string, std::vector<HeldPiece>> held;
  if (world.rank() == kRoot) held = held_pieces(texts, run.global_layout, problem);
  problem = world.broadcast_text(problem, kRoot);
  LS_CHECK(problem.empty(), "model hash: ", problem);
  ckpt::ModelHasher hasher;
  std::vector<float> send, received, whole;
  std::vector<int64_t> counts(static_cast<size_t>(world.size()));
  for (const ParamTensor& t : run.global_layout) {
    send.clear();
    for (const SavedPiece* piece : mine[t.name]) {
      const float* from = piece_params(run, *piece);
      send.insert(send.end(), from, from + (piece->end - piece->first));
    }
    std::fill(counts.begin(), counts.end(), 0);
    const std::vector<HeldPiece>& places = held[t.name];
    for (const HeldPiece& h : places) counts[static_cast<size_t>(h.rank)] += h.count;
    received.resize(world.rank() == kRoot ? static_cast<size_t>(t.numel) : 0);
    world.gatherv(send.data(), static_cast<int64_t>(send.size()), received.data(), counts, DType::kF32, kRoot);
    if (world.rank() != kRoot) continue;
    whole.resize(static_cast<size_t>(t.numel));
    std::vector<int64_t> at(counts.size(), 0);  // where each rank's next piece starts in `received`
    for (size_t r = 1; r < counts.size(); ++r) at[r] = at[r - 1] + counts[r - 1];
    for (const HeldPiece& h : places) {
      for (const ckpt::PlaceRun& r : h.runs) {
        std::copy_n(received.begin() + at[static_cast<size_t>(h.rank)] + r.at, r.count, whole.begin() + r.global);
      }
      at[static_cast<size_t>(h.rank)] += h.count;
    }
    hasher.add({ckpt::kModelPrefix + t.name, DType::kF32, t.shape, whole.data()});
  }
  return world.broadcast_text(world.rank() == kRoot ? hex64(hasher.digest()) : std::string(), kRoot);
}

}  // namespace lockstep
