#include "src/train/checkpointing.hpp"

#include <sstream>
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

void Checkpointer::save(int64_t step_done, float loss) {
  const RunConfig& cfg = run_.cfg;
  if (cfg.checkpoint.dir.empty()) return;
  std::vector<float> m, v;
  run_.ddp.gather_optimizer_state(m, v);
  const std::vector<float> w = run_.gather(run_.model.params()), mg = run_.gather(m.data()), vg = run_.gather(v.data());
  if (run_.world.rank() != 0) return;
  const ParallelConfig& pc = cfg.parallel;
  nlohmann::json layout = {{"dp", run_.dp.size()}, {"tp", run_.tp.size()}, {"sp", pc.sp}, {"zero", pc.zero},
                           {"reduce", pc.reduce}};
  if (run_.tensor_parallel()) layout["tp_shards"] = parallel::describe_shards(cfg.model, run_.tp.size());
  nlohmann::json observers = nlohmann::json::object();
  for (const StepObserver* o : observers_) {
    if (!o->state_key().empty()) observers[o->state_key()] = o->save_state();
  }
  const nlohmann::json state = {{"step", step_done}, {"sampler", run_.sampler.state()}, {"config", cfg.to_json()},
                                {"layout", layout},  {"loss", loss}, {"observers", observers}};
  const auto dir = ckpt::save(cfg.checkpoint.dir, step_done,
                              state_tensors(run_.global_layout, w.data(), mg.data(), vg.data()), state,
                              static_cast<int>(cfg.checkpoint.keep));
  run_.out << "checkpoint " << dir << "\n";
  if (on_saved_) on_saved_(dir, step_done);
}

std::string model_hash(const TrainRun& run) {
  const std::vector<float> params = run.gather(run.model.params());
  return hex64(ckpt::model_hash(state_tensors(run.global_layout, params.data(), nullptr, nullptr)));
}

}  // namespace lockstep
