#include "verify/moe_report.hpp"

#include <algorithm>
#include <iomanip>
#include <numeric>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "verify/metrics_records.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::verify {
namespace {

// Mean of v over [first, end).
double mean(const std::vector<double>& v, size_t first, size_t end) {
  if (end <= first) return 0;
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(end),
                         0.0) / static_cast<double>(end - first);
}

// The first tenth of the steps, and the last (one step at least).
size_t tenth(const MoeLayerSeries& s) { return std::max<size_t>(1, s.step.size() / 10); }

// Each expert's share of the choices over the steps [first, end).
std::vector<double> shares(const MoeLayerSeries& s, size_t first, size_t end) {
  std::vector<double> total(s.routed.front().size(), 0.0);
  for (size_t i = first; i < end; ++i)
    for (size_t e = 0; e < total.size(); ++e) total[e] += s.routed[i][e];
  const double all = std::accumulate(total.begin(), total.end(), 0.0);
  for (double& t : total) t = all > 0 ? t / all : 0;
  return total;
}

}  // namespace

std::vector<double> busiest_rank_load(const MoeReport& r, int64_t ep) {
  const size_t experts = r.layers.begin()->second.routed.front().size();
  LS_REQUIRE(ep >= 1 && experts % static_cast<size_t>(ep) == 0, "--ep: ", ep, " does not divide the run's ", experts,
             " experts");
  const size_t steps = r.layers.begin()->second.step.size(), held = experts / static_cast<size_t>(ep);
  std::vector<double> load(steps, 0.0);
  for (size_t i = 0; i < steps; ++i) {
    double busiest = 0, average = 0;
    for (const auto& [name, s] : r.layers) {
      double most = 0, all = 0;
      for (size_t first = 0; first < experts; first += held) {
        const double rows = std::accumulate(s.routed[i].begin() + static_cast<std::ptrdiff_t>(first),
                                            s.routed[i].begin() + static_cast<std::ptrdiff_t>(first + held), 0.0);
        most = std::max(most, rows);
        all += rows;
      }
      busiest += most;
      average += all / static_cast<double>(ep);
    }
    load[i] = average > 0 ? busiest / average : 1;
  }
  return load;
}

MoeReport read_moe_report(const std::string& metrics_path) {
  MoeReport r;
  for_each_metrics_record(metrics_path, [&](const nlohmann::json& j, int64_t n) {
    if (!j.contains("moe")) return;
    LS_REQUIRE_DATA(j.contains("step") && j["step"].is_number_integer() && j["moe"].is_object(), metrics_path, ":", n,
                    ": a moe record needs an integer \"step\" and an object of layers");
    for (const auto& [name, l] : j["moe"].items()) {
      const auto number = [&](const char* key) {
        LS_REQUIRE_DATA(l.contains(key) && (l[key].is_number() || l[key].is_null()), metrics_path, ":", n, ": ", name,
                        ": expected a number \"", key, "\"");
        return l[key].is_null() ? 0.0 : l[key].get<double>();
      };
      LS_REQUIRE_DATA(l.contains("routed") && l["routed"].is_array() && !l["routed"].empty(), metrics_path, ":", n, ": ",
                      name, ": expected the experts' \"routed\" counts");
      MoeLayerSeries& s = r.layers[name];
      s.step.push_back(static_cast<double>(j["step"].get<int64_t>()));
      s.load.push_back(number("load"));
      s.dropped.push_back(number("dropped"));
      s.aux_loss.push_back(number("aux_loss"));
      s.entropy.push_back(number("entropy"));
      s.routed.push_back(l["routed"].get<std::vector<double>>());
      LS_REQUIRE_DATA(s.routed.back().size() == s.routed.front().size(), metrics_path, ":", n, ": ", name, " has ",
                      s.routed.back().size(), " experts, ", s.routed.front().size(), " before");
    }
  });
  LS_REQUIRE_DATA(!r.layers.empty(), metrics_path,
                  ": no moe records (a run of a model with [model] moe_experts > 0 and [log] metrics writes them)");
  return r;
}

void print_moe_report(const MoeReport& r, std::ostream& out, int64_t ep) {
  const MoeLayerSeries& any = r.layers.begin()->second;
  out << "moe report: " << r.layers.size() << " MoE layers, " << any.step.size() << " steps, "
      << any.routed.front().size() << " experts each\n"
      << "load = the most chosen expert over the mean (1 balanced); first and last tenth of the steps, and the worst step\n";
  out << std::fixed;
  for (const auto& [name, s] : r.layers) {
    const size_t n = s.step.size(), k = tenth(s);
    out << "  " << std::left << std::setw(14) << name << std::right << " load " << std::setprecision(2)
        << mean(s.load, 0, k) << " -> " << mean(s.load, n - k, n) << " (worst "
        << *std::max_element(s.load.begin(), s.load.end()) << ")   dropped " << 100 * mean(s.dropped, 0, k) << "% -> "
        << 100 * mean(s.dropped, n - k, n) << "%   balancing loss " << std::setprecision(4) << mean(s.aux_loss, n - k, n)
        << "   entropy " << std::setprecision(3) << mean(s.entropy, n - k, n) << " nats\n";
    out << "    experts' shares (last tenth):";
    for (double x : shares(s, n - k, n)) out << " " << std::setprecision(3) << x;
    out << "\n";
  }
  if (ep > 1) {
    const std::vector<double> load = busiest_rank_load(r, ep);
    const size_t n = load.size(), k = tenth(any);
    out << "expert parallelism over " << ep << " ranks (" << any.routed.front().size() / static_cast<size_t>(ep)
        << " experts each): the busiest rank's routed rows over the mean, summed over the layers, "
        << std::setprecision(3) << mean(load, 0, k) << " -> " << mean(load, n - k, n) << " (worst "
        << *std::max_element(load.begin(), load.end()) << "); lockstep plan --moe-load " << mean(load, n - k, n) << "\n";
  }
  out << std::defaultfloat;
}

std::string moe_report_svg(const MoeReport& r) {
  std::vector<PlotSeries> load, dropped;
  const std::pair<const std::string, MoeLayerSeries>* worst = &*r.layers.begin();
  for (const auto& entry : r.layers) {
    const auto& [name, s] = entry;
    load.push_back({name, s.step, s.load});
    dropped.push_back({name, s.step, s.dropped});
    if (mean(s.load, 0, s.load.size()) > mean(worst->second.load, 0, worst->second.load.size())) worst = &entry;
  }
  std::vector<std::string> plots = {
      svg_line_plot("expert load (the most chosen expert over the mean; 1 is balanced)", "step", "load", load)};
  const bool drops = std::any_of(dropped.begin(), dropped.end(), [](const PlotSeries& p) {
    return std::any_of(p.y.begin(), p.y.end(), [](double y) { return y > 0; });
  });
  if (drops) plots.push_back(svg_line_plot("dropped share of the choices (capacity)", "step", "dropped", dropped));
  // The least balanced layer's experts over (at most 60) spans of steps.
  const MoeLayerSeries& s = worst->second;
  const size_t spans = std::min<size_t>(60, s.step.size()), experts = s.routed.front().size();
  std::vector<std::string> rows, cols;
  std::vector<std::vector<double>> values(experts, std::vector<double>(spans));
  for (size_t e = 0; e < experts; ++e) rows.push_back("expert " + std::to_string(e));
  for (size_t c = 0; c < spans; ++c) {
    const size_t first = c * s.step.size() / spans, end = (c + 1) * s.step.size() / spans;
    cols.push_back(std::to_string(static_cast<int64_t>(s.step[first])));
    const std::vector<double> share = shares(s, first, end);
    for (size_t e = 0; e < experts; ++e) values[e][c] = share[e];
  }
  plots.push_back(svg_heat_map(worst->first + ": each expert's share of the choices (columns: from step)", rows, cols,
                               values, "share"));
  return svg_stack(plots);
}

}  // namespace lockstep::verify
