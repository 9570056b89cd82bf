#include "src/train/fp8_statistics.hpp"

#include <cmath>
#include <iomanip>
#include <stdexcept>

#include "src/core/check.hpp"

namespace lockstep {

void combine_fp8_statistics(comm::Communicator& world, Fp8State& state) {
  std::vector<float> amax = state.step_amax();
  std::vector<double> counts = state.step_counts();
  for (float& a : amax) {
    if (std::isnan(a)) a = INFINITY;
  }
  if (world.size() > 1) {
    world.all_reduce(std::span<float>(amax), comm::ReduceOp::kMax);
    // Counts: integers below 2^53, an exact sum in any order; the energies: a sum of doubles.
    world.all_reduce(std::span<double>(counts), comm::ReduceOp::kSum);
  }
  state.set_step_stats(amax, counts);
  state.finish_step();
}

nlohmann::json fp8_step_record(const Fp8State& state) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < state.size(); ++i) {
    const Fp8TensorStats& s = state.step_stats(i);
    if (s.numel == 0) continue;  // a tensor no GEMM read in fp8 (fp8.gemms)
    nlohmann::json t = {{"amax", std::isfinite(s.amax) ? nlohmann::json(s.amax) : nlohmann::json(nullptr)},
                        {"saturated", s.saturated_fraction()},
                        {"underflow", s.underflow_fraction()},
                        {"error_ratio", s.error_ratio()},
                        {"nonfinite", s.nonfinite}};
    if (state.recipe().scaling == Fp8Scaling::kDelayed) t["scale"] = state.last_scale(i);
    out[state.name(i)] = std::move(t);
  }
  return out;
}

void Fp8Statistics::end_step(const StepRecord& r) {
  const Fp8State* state = run_.model.fp8();
  if (state == nullptr) return;
  if (metrics_.enabled()) metrics_.write({{"step", r.done()}, {"fp8", fp8_step_record(*state)}});
  if (r.done() % run_.cfg.log.every != 0 && !r.last) return;
  // The worst tensor by saturation and by underflow.
  size_t sat = 0, under = 0;
  for (size_t i = 0; i < state->size(); ++i) {
    if (state->step_stats(i).saturated_fraction() > state->step_stats(sat).saturated_fraction()) sat = i;
    if (state->step_stats(i).underflow_fraction() > state->step_stats(under).underflow_fraction()) under = i;
  }
  run_.out << "fp8: most saturated " << state->name(sat) << " " << std::setprecision(3) << std::defaultfloat
           << 100 * state->step_stats(sat).saturated_fraction() << "%, most underflow " << state->name(under) << " "
           << 100 * state->step_stats(under).underflow_fraction() << "%\n";
}

nlohmann::json Fp8Statistics::save_state() const {
  const Fp8State* state = run_.model.fp8();
  return state != nullptr ? state->save() : nlohmann::json(nullptr);
}

void Fp8Statistics::restore_state(const nlohmann::json& j) {
  Fp8State* state = run_.model.fp8();
  if (state == nullptr || j.is_null()) return;
  try {
    state->restore(j);
  } catch (const std::exception& e) {
    throw ConfigError(str_cat("the saved fp8 state does not fit this run: ", e.what()));
  }
}

}  // namespace lockstep
