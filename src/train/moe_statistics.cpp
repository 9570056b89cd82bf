#include "src/train/moe_statistics.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>

#include "src/core/check.hpp"

namespace lockstep {

std::vector<MoeLayerStats> combine_moe_statistics(const TrainRun& run) {
  std::vector<MoeLayerStats> all;
  for (const LayerDesc& l : run.model.desc().layers) {
    if (l.kind != LayerKind::kMoe) continue;
    const auto E = static_cast<size_t>(l.experts);
    all.push_back({.layer = l.prefix + "moe", .routed = std::vector<double>(E), .kept = std::vector<double>(E)});
  }
  if (all.empty()) return all;
  // Per layer: routed (E), kept (E), aux_loss, sequences, entropy, tokens.
  std::vector<double> flat;
  for (const MoeLayerStats& a : all) flat.resize(flat.size() + 2 * a.routed.size() + 4, 0.0);
  if (run.tp.rank() == 0) {
    size_t at = 0;
    for (const MoeLayerStats& a : all) {
      const auto own = std::find_if(run.model.moe_stats().begin(), run.model.moe_stats().end(),
                                    [&](const MoeLayerStats& s) { return s.layer == a.layer; });
      const size_t E = a.routed.size();
      if (own != run.model.moe_stats().end()) {
        std::copy(own->routed.begin(), own->routed.end(), flat.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(own->kept.begin(), own->kept.end(), flat.begin() + static_cast<std::ptrdiff_t>(at + E));
        flat[at + 2 * E] = own->aux_loss;
        flat[at + 2 * E + 1] = own->sequences;
        flat[at + 2 * E + 2] = own->entropy;
        flat[at + 2 * E + 3] = own->tokens;
      }
      at += 2 * E + 4;
    }
  }
  if (run.world.size() > 1) run.world.all_reduce(std::span<double>(flat), comm::ReduceOp::kSum);
  size_t at = 0;
  for (MoeLayerStats& a : all) {
    const size_t E = a.routed.size();
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + E),
              a.routed.begin());
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at + E), flat.begin() + static_cast<std::ptrdiff_t>(at + 2 * E),
              a.kept.begin());
    a.aux_loss = flat[at + 2 * E];
    a.sequences = flat[at + 2 * E + 1];
    a.entropy = flat[at + 2 * E + 2];
    a.tokens = flat[at + 2 * E + 3];
    at += 2 * E + 4;
  }
  return all;
}

double moe_load_imbalance(const MoeLayerStats& s) {
  const double total = std::accumulate(s.routed.begin(), s.routed.end(), 0.0);
  if (total == 0) return 0;
  return *std::max_element(s.routed.begin(), s.routed.end()) / (total / static_cast<double>(s.routed.size()));
}

namespace {

double dropped_fraction(const MoeLayerStats& s) {
  const double routed = std::accumulate(s.routed.begin(), s.routed.end(), 0.0);
  const double kept = std::accumulate(s.kept.begin(), s.kept.end(), 0.0);
  return routed > 0 ? (routed - kept) / routed : 0;
}

}  // namespace

void update_selection_biases(const std::vector<MoeLayerStats>& layers, float rate,
                             std::map<std::string, std::vector<float>>& biases) {
  for (const MoeLayerStats& s : layers) {
    const auto it = biases.find(s.layer);
    if (it == biases.end()) continue;
    const double mean = std::accumulate(s.routed.begin(), s.routed.end(), 0.0) / static_cast<double>(s.routed.size());
    for (size_t e = 0; e < s.routed.size(); ++e) {
      const float sign = s.routed[e] < mean ? 1.0f : (s.routed[e] > mean ? -1.0f : 0.0f);
      it->second[e] = it->second[e] + rate * sign;
    }
  }
}

nlohmann::json moe_step_record(const std::vector<MoeLayerStats>& layers) {
  nlohmann::json out = nlohmann::json::object();
  for (const MoeLayerStats& s : layers) {
    out[s.layer] = {{"routed", s.routed},
                    {"kept", s.kept},
                    {"dropped", dropped_fraction(s)},
                    {"load", moe_load_imbalance(s)},
                    {"aux_loss", s.sequences > 0 ? nlohmann::json(s.aux_loss / s.sequences) : nlohmann::json(nullptr)},
                    {"entropy", s.tokens > 0 ? s.entropy / s.tokens : 0.0}};
  }
  return out;
}

void MoeStatistics::end_step(const StepRecord& r) {
  auto& biases = run_.model.moe_selection_biases();
  if (!run_.cfg.log.moe && biases.empty()) return;  // the same on every rank
  const std::vector<MoeLayerStats> layers = combine_moe_statistics(run_);
  if (layers.empty()) return;
  update_selection_biases(layers, run_.cfg.model.moe_bias_update, biases);
  if (!run_.cfg.log.moe) return;
  if (metrics_.enabled()) {
    nlohmann::json record = moe_step_record(layers);
    for (const auto& [layer, bias] : biases) record[layer]["bias"] = bias;
    metrics_.write({{"step", r.done()}, {"moe", std::move(record)}});
  }
  if (r.done() % run_.cfg.log.every != 0 && !r.last) return;
  // The layer furthest from balance, and the totals over layers.
  const MoeLayerStats* worst = &layers.front();
  double dropped = 0, aux = 0, entropy = 0;
  for (const MoeLayerStats& s : layers) {
    if (moe_load_imbalance(s) > moe_load_imbalance(*worst)) worst = &s;
    dropped += dropped_fraction(s);
    aux += s.sequences > 0 ? s.aux_loss / s.sequences : 0;
    entropy += s.tokens > 0 ? s.entropy / s.tokens : 0;
  }
  const auto n = static_cast<double>(layers.size());
  run_.out << "moe: load max/mean " << std::fixed << std::setprecision(2) << moe_load_imbalance(*worst) << " ("
           << worst->layer << "), dropped " << std::setprecision(2) << 100 * dropped / n << "%, balancing loss "
           << std::setprecision(4) << aux / n << ", router entropy " << std::setprecision(3) << entropy / n
           << " nats (uniform " << std::log(static_cast<double>(worst->kept.size())) << ")\n"
           << std::defaultfloat;
}

nlohmann::json MoeStatistics::save_state() const {
  const auto& biases = run_.model.moe_selection_biases();
  return biases.empty() ? nlohmann::json(nullptr) : nlohmann::json(biases);
}

void MoeStatistics::restore_state(const nlohmann::json& state) {
  auto& biases = run_.model.moe_selection_biases();
  if (state.is_null()) {
    LS_REQUIRE(biases.empty(), "the saved state has no MoE selection biases, which this run ([model] moe_bias_update) moves");
    return;
  }
  for (auto& [layer, bias] : biases) {
    LS_REQUIRE(state.contains(layer) && state[layer].size() == bias.size(), "the saved MoE selection biases do not fit ",
               layer, " of this run");
    bias = state[layer].get<std::vector<float>>();
  }
}

}  // namespace lockstep
