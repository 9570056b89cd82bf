#include "verify/fp8_report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "verify/metrics_records.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::verify {

namespace {

double number_or_nan(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : NAN; }

double largest(const Fp8Series& s, size_t* at = nullptr) {
  double m = -1;
  for (size_t i = 0; i < s.value.size(); ++i) {
    if (std::isfinite(s.value[i]) && s.value[i] > m) {
      m = s.value[i];
      if (at != nullptr) *at = i;
    }
  }
  return m;
}

double mean(const Fp8Series& s) {
  double sum = 0;
  size_t n = 0;
  for (double v : s.value) {
    if (!std::isfinite(v)) continue;
    sum += v;
    ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

// The `top` names of `table` with the largest score, largest first.
template <class Score>
std::vector<std::string> worst(const std::map<std::string, std::map<std::string, Fp8Series>>& table, size_t top,
                               Score score) {
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [name, series] : table) ranked.emplace_back(score(series), name);
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(top, ranked.size()); ++i) out.push_back(ranked[i].second);
  return out;
}

const Fp8Series& series_of(const std::map<std::string, Fp8Series>& m, const std::string& key) {
  static const Fp8Series kNone;
  const auto it = m.find(key);
  return it == m.end() ? kNone : it->second;
}

}  // namespace

Fp8Report read_fp8_report(const std::string& metrics_path) {
  Fp8Report r;
  for_each_metrics_record(metrics_path, [&](const nlohmann::json& j, int64_t n) {
    if (j.contains("finding") && j["finding"].value("detector", "") == "fp8") {
      const nlohmann::json& f = j["finding"];
      r.findings.push_back(str_cat("after step ", f.value("step", int64_t{0}), ": ", f.value("site", ""), " ",
                                   f.value("classification", ""), " ", number_or_nan(f["magnitude"]), " > ",
                                   number_or_nan(f["bound"]), " (", f.value("unit", ""), ")"));
      return;
    }
    const bool stats = j.contains("fp8"), checks = j.contains("fp8_sentinel");
    if (!stats && !checks) return;
    LS_REQUIRE_DATA(j.contains("step") && j["step"].is_number_integer(), metrics_path, ":", n,
                    ": an fp8 record without an integer \"step\"");
    const auto step = static_cast<double>(j["step"].get<int64_t>());
    const nlohmann::json& body = stats ? j["fp8"] : j["fp8_sentinel"];
    LS_REQUIRE_DATA(body.is_object(), metrics_path, ":", n, ": expected an object of tensors or GEMMs");
    auto& table = stats ? r.tensors : r.gemms;
    for (const auto& [name, values] : body.items()) {
      LS_REQUIRE_DATA(values.is_object(), metrics_path, ":", n, ": ", name, ": expected an object of statistics");
      for (const auto& [key, v] : values.items()) {
        Fp8Series& s = table[name][key];
        s.step.push_back(step);
        s.value.push_back(number_or_nan(v));
      }
    }
    (stats ? r.steps : r.checks) += 1;
  });
  LS_REQUIRE_DATA(r.steps > 0 || r.checks > 0, metrics_path,
                  ": no fp8 records (a run with [train] precision = \"fp8\" and [log] metrics writes them)");
  return r;
}

void print_fp8_report(const Fp8Report& r, size_t top, std::ostream& out) {
  out << "fp8 report: " << r.steps << " steps of per-tensor statistics, " << r.checks << " shadow checks, "
      << r.findings.size() << " findings\n";
  if (!r.gemms.empty()) {
    out << "which layers' quantization hurts most (the GEMM's relative error against its bf16 product, mean over "
           "the checks; the largest error / probabilistic bound):\n";
    for (const std::string& g : worst(r.gemms, top, [](const auto& s) { return mean(series_of(s, "rel_error")); })) {
      const auto& s = r.gemms.at(g);
      out << "  " << std::left << std::setw(36) << g << std::right << " relative error " << std::setprecision(3)
          << mean(series_of(s, "rel_error")) << "   error/bound " << largest(series_of(s, "ratio")) << "\n";
    }
  }
  // Checks where a GEMM's quantization error was as large as its bf16 product: its result mostly
  // noise (within its bound), a layer that may not learn in fp8 where it would in bf16.
  std::vector<std::string> noisy;
  for (const auto& [g, series] : r.gemms) {
    const Fp8Series& rel = series_of(series, "rel_error");
    int64_t n = 0;
    double worst_value = 0, worst_step = 0;
    for (size_t i = 0; i < rel.value.size(); ++i) {
      if (!(rel.value[i] >= 1)) continue;
      ++n;
      if (rel.value[i] > worst_value) worst_value = rel.value[i], worst_step = rel.step[i];
    }
    if (n > 0) {
      noisy.push_back(str_cat(g, ": ", n, " of ", rel.value.size(), " checks, up to ", worst_value, " (step ",
                              static_cast<int64_t>(worst_step), ")"));
    }
  }
  if (!noisy.empty()) {
    out << "GEMMs whose quantization error reached their bf16 product (relative error >= 1: the result mostly "
           "noise):\n";
    for (const std::string& n : noisy) out << "  " << n << "\n";
  }
  if (!r.tensors.empty()) {
    out << "tensors, worst step first (quantization error / what rounding may cost; saturated; underflow):\n";
    for (const std::string& t :
         worst(r.tensors, top, [](const auto& s) { return largest(series_of(s, "error_ratio")); })) {
      const auto& s = r.tensors.at(t);
      out << "  " << std::left << std::setw(36) << t << std::right;
      for (const char* key : {"error_ratio", "saturated", "underflow"}) {
        const Fp8Series& x = series_of(s, key);
        size_t at = 0;
        const double m = largest(x, &at);
        out << "  " << key << " " << std::setprecision(3) << std::max(m, 0.0);
        if (m > 0) out << " (step " << static_cast<int64_t>(x.step[at]) << ")";
      }
      out << "\n";
    }
  }
  for (const std::string& f : r.findings) out << "finding " << f << "\n";
}

std::string fp8_report_svg(const Fp8Report& r, size_t top) {
  const auto plot = [&](const std::map<std::string, std::map<std::string, Fp8Series>>& table,
                        const std::vector<std::string>& names, const std::string& key, const std::string& title,
                        const std::string& x_label, const std::string& y_label) {
    std::vector<PlotSeries> series;
    for (const std::string& n : names) {
      const Fp8Series& s = series_of(table.at(n), key);
      series.push_back({n, s.step, s.value});
    }
    return svg_line_plot(title, x_label, y_label, series);
  };
  const auto by_error = worst(r.tensors, top, [](const auto& s) { return largest(series_of(s, "error_ratio")); });
  const auto by_saturation = worst(r.tensors, top, [](const auto& s) { return largest(series_of(s, "saturated")); });
  const auto by_gemm = worst(r.gemms, top, [](const auto& s) { return mean(series_of(s, "rel_error")); });
  std::vector<std::string> plots;
  if (!r.tensors.empty()) {
    plots.push_back(plot(r.tensors, by_error, "error_ratio",
                         "quantization error / what rounding may cost (above 1: saturation)", "step", "error / bound"));
    plots.push_back(plot(r.tensors, by_saturation, "saturated", "saturated fraction", "step", "fraction of elements"));
    plots.push_back(plot(r.tensors, by_error, "amax", "amax of the tensors above", "step", "amax"));
  }
  if (!r.gemms.empty()) {
    plots.push_back(plot(r.gemms, by_gemm, "rel_error", "GEMM error against the bf16 product (sentinel checks)", "step",
                         "relative error"));
  }
  return svg_stack(plots);
}

}  // namespace lockstep::verify
