#include "src/train/checkpointing.hpp"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <tuple>
#include <vector>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/parallel/tensor_parallel.hpp"

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
void check_resumable(const ckpt::Checkpoint& ck, const RunConfig& cfg) {
  const nlohmann::json now = cfg.to_json();
  const nlohmann::json& then = ck.state.at("config");
  for (const auto& [key, value] : now["model"].items()) {
    LS_REQUIRE(then["model"].contains(key) && then["model"][key] == value, ck.dir,
               ": cannot resume: it was written with [model] ", key, " = ",
               then["model"].value(key, nlohmann::json()).dump(), ", this run has ", value.dump(),
               " (use another [checkpoint] dir, or the same config)");
  }
  // A key a checkpoint predates had its default then (fp32 throughout).
  const nlohmann::json defaults = RunConfig{}.to_json()["train"];
  for (const char* key : {"batch_size", "mode", "seed", "precision", "fp32_linears", "master_weights"}) {
    const nlohmann::json was = then["train"].contains(key) ? then["train"][key] : defaults[key];
    LS_REQUIRE(was == now["train"][key], ck.dir, ": cannot resume: it was written with [train] ", key, " = ",
               was.dump(), ", this run has ", now["train"][key].dump());
  }
}

}  // namespace

Resumed resume(TrainRun& run) {
  const RunConfig& cfg = run.cfg;
  if (cfg.checkpoint.dir.empty()) return {};
  std::ostringstream warnings;
  auto ck = ckpt::load_latest(cfg.checkpoint.dir, warnings);
  run.out << warnings.str() << std::flush;  // "warning: skipping checkpoint ..." lines
  if (!ck) return {};
  check_resumable(*ck, cfg);
  const std::vector<ParamTensor>& global = run.global_layout;
  std::vector<float> w(static_cast<size_t>(global.back().offset + global.back().numel)), m(w.size()), v(w.size());
  for (const auto& p : global) {
    ck->copy_to(ckpt::kModelPrefix + p.name, DType::kF32, p.shape, w.data() + p.offset);
    ck->copy_to("optim/m/" + p.name, DType::kF32, p.shape, m.data() + p.offset);
    ck->copy_to("optim/v/" + p.name, DType::kF32, p.shape, v.data() + p.offset);
  }
  Model& model = run.model;
  std::vector<float> m_local(static_cast<size_t>(model.num_params())), v_local(m_local.size());
  parallel::take_local(cfg.model, model.param_layout(), w.data(), model.params());
  parallel::take_local(cfg.model, model.param_layout(), m.data(), m_local.data());
  parallel::take_local(cfg.model, model.param_layout(), v.data(), v_local.data());
  run.ddp.load_optimizer_state(m_local.data(), v_local.data());
  run.sampler.restore(ck->state.at("sampler").get<data::SamplerState>());
  Resumed r;
  r.step = ck->state.at("step").get<int64_t>();
  if (ck->state.contains("observers")) r.observers = ck->state.at("observers");
  run.out << "resumed from " << ck->dir << " (step " << r.step << ")\n";
  return r;
}

void restore_observers(std::span<StepObserver* const> observers, const nlohmann::json& saved) {
  for (StepObserver* o : observers) {
    const std::string key = o->state_key();
    if (!key.empty() && saved.contains(key)) o->restore_state(saved.at(key));
  }
}

void Checkpointer::end_step(const StepRecord& r) {
  const CheckpointConfig& c = run_.cfg.checkpoint;
  if (r.last || r.stopping || (c.every > 0 && r.done() % c.every == 0)) save(r.done(), r.loss);
}

namespace {

// The shards this rank writes: of its tensor-parallel slice of the model — the parameters and both
// AdamW moments alike — the flat elements [first, end) of its data-parallel part: its ZeRO shard,
// or without ZeRO an equal split of the slice between the replicas; of a tensor every tp rank holds
// whole, its tp rank's equal part of that. So every rank writes its share.
std::vector<ckpt::ShardRef> own_shards(TrainRun& run, int zero) {
  std::vector<ckpt::ShardRef> shards;
  const int64_t n = run.model.num_params(), dp = run.dp.size(), r = run.dp.rank();
  const int64_t first = zero > 0 ? run.ddp.shard_first() : r * n / dp;
  const int64_t end = zero > 0 ? run.ddp.shard_end() : (r + 1) * n / dp;
  // Where the moments buffer starts: this rank's shard under ZeRO, else the whole slice.
  const int64_t moments_first = zero > 0 ? run.ddp.shard_first() : 0;
  const float* m = run.ddp.moments_m().data();
  const float* v = run.ddp.moments_v().data();
  const int64_t tp = run.tp.size(), t = run.tp.rank();
  for (const ParamTensor& p : run.model.param_layout()) {
    int64_t lo = std::max(first, p.offset), hi = std::min(end, p.offset + p.numel);
    if (p.replicated() && lo < hi) std::tie(lo, hi) = std::pair{lo + t * (hi - lo) / tp, lo + (t + 1) * (hi - lo) / tp};
    if (lo >= hi) continue;
    const ckpt::ShardPlace where{p.replicated() ? -1 : p.split_dim, p.ranges, lo - p.offset, hi - p.offset};
    shards.push_back({ckpt::kModelPrefix + p.name, DType::kF32, p.global_shape, where, run.model.params() + lo});
    shards.push_back({"optim/m/" + p.name, DType::kF32, p.global_shape, where, m + (lo - moments_first)});
    shards.push_back({"optim/v/" + p.name, DType::kF32, p.global_shape, where, v + (lo - moments_first)});
  }
  return shards;
}

// Every rank's error (empty where none), or, when one failed, the same DataError on every rank —
// so that the ranks stop together and the error is printed once.
void agree_or_throw(comm::Communicator& world, const std::string& mine) {
  for (const std::string& e : world.all_gather_text(mine)) {
    if (!e.empty()) throw DataError(e);
  }
}

}  // namespace

void Checkpointer::save(int64_t step_done, float loss) {
  const RunConfig& cfg = run_.cfg;
  if (cfg.checkpoint.dir.empty()) return;
  comm::Communicator& world = run_.world;
  const ParallelConfig& pc = cfg.parallel;
  // World rank 0 opens the checkpoint's temporary directory; every rank writes its own shards
  // there (no rank gathers another's tensors); rank 0 writes the manifest once every file is
  // durable, and renames.
  const auto started = std::chrono::steady_clock::now();
  std::string tmp, error;
  if (world.rank() == 0) {
    try {
      tmp = ckpt::begin_save(cfg.checkpoint.dir, step_done);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  agree_or_throw(world, error);
  tmp = world.broadcast_text(tmp, 0);
  std::string record;
  try {
    const std::vector<ckpt::ShardRef> shards = own_shards(run_, static_cast<int>(pc.zero));
    if (!shards.empty()) record = ckpt::write_shards(tmp, world.rank(), shards).dump();
  } catch (const InputError& e) {
    error = e.what();
  }
  agree_or_throw(world, error);
  const std::vector<std::string> records = world.all_gather_text(record);
  std::string dir;
  struct {
    uint64_t total = 0, largest = 0;
    size_t files = 0;
  } written;
  if (world.rank() == 0) {
    std::vector<ckpt::TensorDesc> tensors;
    for (const char* prefix : {ckpt::kModelPrefix, "optim/m/", "optim/v/"}) {
      for (const ParamTensor& p : run_.global_layout) tensors.push_back({prefix + p.name, DType::kF32, p.shape});
    }
    std::vector<nlohmann::json> parsed;
    for (const std::string& r : records) {
      if (!r.empty()) parsed.push_back(nlohmann::json::parse(r));
    }
    for (const nlohmann::json& r : parsed) {
      const auto bytes = r.at("file").at("bytes").get<uint64_t>();
      written.total += bytes;
      written.largest = std::max(written.largest, bytes);
    }
    written.files = parsed.size();
    nlohmann::json layout = {{"dp", run_.dp.size()}, {"tp", run_.tp.size()}, {"sp", pc.sp}, {"zero", pc.zero},
                             {"reduce", pc.reduce}};
    if (run_.tensor_parallel()) layout["tp_shards"] = parallel::describe_shards(cfg.model, run_.tp.size());
    nlohmann::json observers = nlohmann::json::object();
    for (const StepObserver* o : observers_) {
      if (!o->state_key().empty()) observers[o->state_key()] = o->save_state();
    }
    const nlohmann::json state = {{"step", step_done}, {"sampler", run_.sampler.state()}, {"config", cfg.to_json()},
                                  {"layout", layout},  {"loss", loss}, {"observers", observers}};
    // Without tensor parallelism rank 0 holds every parameter whole and can hash the model.
    const std::string hash =
        run_.tensor_parallel()
            ? ""
            : hex64(ckpt::model_hash(state_tensors(run_.global_layout, run_.model.params(), nullptr, nullptr)));
    try {
      dir = ckpt::finish_save(cfg.checkpoint.dir, step_done, tmp, tensors, parsed,
                              {{"dp", run_.dp.size()}, {"tp", run_.tp.size()}, {"pp", 1}}, state, hash,
                              static_cast<int>(cfg.checkpoint.keep), cfg.checkpoint.keep_every);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  agree_or_throw(world, error);
  if (world.rank() != 0) return;
  // The stall the save cost the step: every rank waits for the slowest writer and the manifest.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::ostringstream line;
  line << "checkpoint " << dir << " (" << written.files << (written.files == 1 ? " file, " : " files, ") << std::fixed
       << std::setprecision(1) << static_cast<double>(written.total) / 1e6 << " MB, largest "
       << static_cast<double>(written.largest) / 1e6 << " MB; " << std::setprecision(2) << seconds << " s)\n";
  run_.out << line.str();
  if (on_saved_) on_saved_(dir, step_done);
}

std::string model_hash(const TrainRun& run) {
  const std::vector<float> params = run.gather(run.model.params());
  return hex64(ckpt::model_hash(state_tensors(run.global_layout, params.data(), nullptr, nullptr)));
}

}  // namespace lockstep
