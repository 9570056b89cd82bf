// Error-versus-step and per-layer heat map of a diff (diff_plot.hpp).
#include "verify/diff_plot.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::verify {

namespace {

// A tensor name `step/N/<hook>` split into its group, layer (-1: outside the layers) and kind.
struct NameParts {
  std::string group, kind;
  int64_t layer = -1;
};

NameParts parts_of(const std::string& name) {
  static const std::regex kStep(R"(^step/\d+/(.*)$)");
  static const std::regex kLayer(R"(^(grad/param/|param/|grad/)?layer/(\d+)/(.*)$)");
  std::smatch m;
  std::string hook = std::regex_match(name, m, kStep) ? m[1].str() : name;
  NameParts p;
  if (hook == "loss" || hook == "losses") {
    p.group = "loss";
  } else if (hook.rfind("grad/param/", 0) == 0) {
    p.group = "parameter gradients";
  } else if (hook.rfind("param/", 0) == 0) {
    p.group = "parameters";
  } else if (hook.rfind("grad/", 0) == 0) {
    p.group = "activation gradients";
  } else {
    p.group = "activations";
  }
  if (std::regex_match(hook, m, kLayer)) {
    p.layer = std::stoll(m[2].str());
    p.kind = m[1].str() + m[3].str();
  } else {
    p.kind = hook;
  }
  return p;
}

double rel_err(const TensorDiff& d) {
  if (d.shape_a != d.shape_b) return INFINITY;
  return d.bitwise_equal ? 0.0 : std::max(d.max_rel_err, 1e-300);  // differing +0/-0 still shows
}

}  // namespace

std::vector<std::string> write_diff_plots(const DiffReport& r, const std::string& dir) {
  durable_io::make_dirs(dir);
  // Error versus step, one series per group in a fixed order.
  const std::vector<std::string> groups = {"activations", "activation gradients", "loss", "parameter gradients",
                                           "parameters"};
  std::map<std::string, std::map<int64_t, double>> worst;  // group -> step -> max rel err
  for (const auto& d : r.tensors) {
    double& w = worst[parts_of(d.name).group][d.step];
    w = std::max(w, rel_err(d));
  }
  std::vector<PlotSeries> series;
  for (const auto& g : groups) {
    if (!worst.count(g)) continue;
    PlotSeries s{g, {}, {}};
    for (const auto& [step, e] : worst[g]) s.x.push_back(static_cast<double>(step)), s.y.push_back(e);
    series.push_back(std::move(s));
  }
  const std::string lines = dir + "/error_vs_step.svg";
  durable_io::write_file_atomic(
      lines, svg_line_plot("lockstep diff: " + r.dir_a + " vs " + r.dir_b, "step",
                           "max relative error |a-b|/max(|a|,|b|)", series));

  // Heat map at the first divergent step (the last dumped step when they agree).
  int64_t step = -1;
  if (r.first_divergent) {
    step = r.tensors[*r.first_divergent].step;
  } else {
    for (const auto& d : r.tensors) step = std::max(step, d.step);
  }
  std::vector<std::string> kinds;
  int64_t layers = 0;
  std::map<std::pair<int64_t, std::string>, double> cell;
  for (const auto& d : r.tensors) {
    if (d.step != step) continue;
    const NameParts p = parts_of(d.name);
    if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
    layers = std::max(layers, p.layer + 1);
    double& c = cell[{p.layer, p.kind}];
    c = std::max(c, rel_err(d));
  }
  std::vector<std::string> rows;
  std::vector<std::vector<double>> values;
  for (int64_t l = -1; l < layers; ++l) {
    rows.push_back(l < 0 ? std::string("outside layers") : "layer " + std::to_string(l));
    std::vector<double> row;
    for (const auto& k : kinds) {
      const auto it = cell.find({l, k});
      row.push_back(it == cell.end() ? NAN : it->second);
    }
    values.push_back(std::move(row));
  }
  const std::string heat = dir + "/layer_heatmap.svg";
  durable_io::write_file_atomic(
      heat, svg_heat_map(str_cat("max relative error per layer and tensor at step ", step,
                                 r.first_divergent ? " (first divergent step)" : " (dumps agree)"),
                         rows, kinds, values, "max rel err"));
  return {lines, heat};
}

}  // namespace lockstep::verify
