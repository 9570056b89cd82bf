#include "verify/detect/spikes.hpp"

#include <algorithm>
#include <cmath>

#include "src/core/check.hpp"

namespace lockstep::detect {

namespace {

double median_of(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

// The median absolute deviation from the median.
double mad_of(std::vector<double> v) {
  const double m = median_of(v);
  for (double& x : v) x = std::fabs(x - m);
  return median_of(std::move(v));
}

}  // namespace

double jump_z(std::span<const double> history, double x, int64_t recent, double floor) {
  LS_CHECK(history.size() >= 2 && recent >= 1);
  const size_t r = std::min(history.size(), static_cast<size_t>(recent));
  const std::vector<double> last(history.end() - static_cast<std::ptrdiff_t>(r), history.end());
  const double level = median_of(last);
  std::vector<double> diff(history.size() - 1);
  for (size_t i = 1; i < history.size(); ++i) diff[i - 1] = history[i] - history[i - 1];
  const double step_scale = 1.4826 * mad_of(std::move(diff)) / std::sqrt(2.0);
  const double scale = std::max({step_scale, 1.4826 * mad_of(last), floor});
  if (scale == 0) return x > level ? INFINITY : 0.0;
  return (x - level) / scale;
}

double SpikeWindow::judge(double x) {
  if (!(x > 0 && std::isfinite(x))) return 0;
  const double y = std::log(x);
  const double z = static_cast<int64_t>(logs_.size()) >= std::max<int64_t>(rule_.min_history, 2)
                       ? jump_z(logs(), y, rule_.recent, rule_.floor)
                       : 0;
  if (static_cast<int64_t>(logs_.size()) < rule_.window) {
    logs_.push_back(y);
  } else {
    logs_[static_cast<size_t>(next_)] = y;
    next_ = (next_ + 1) % rule_.window;
  }
  return z;
}

double SpikeWindow::recent_median() const {
  if (logs_.empty()) return 0.0;
  const std::vector<double> ordered = logs();
  const size_t r = std::min(ordered.size(), static_cast<size_t>(rule_.recent));
  return std::exp(median_of({ordered.end() - static_cast<std::ptrdiff_t>(r), ordered.end()}));
}

std::vector<double> SpikeWindow::logs() const {
  if (static_cast<int64_t>(logs_.size()) < rule_.window) return logs_;
  std::vector<double> out(logs_.begin() + next_, logs_.end());
  out.insert(out.end(), logs_.begin(), logs_.begin() + next_);
  return out;
}

void SpikeWindow::restore(const std::vector<double>& logs) {
  const size_t keep = std::min(logs.size(), static_cast<size_t>(rule_.window));
  logs_.assign(logs.end() - static_cast<std::ptrdiff_t>(keep), logs.end());
  next_ = 0;
}

void SpikeDetector::end_step(const StepRecord& r) {
  for (auto [site, window, x, threshold] : {std::tuple{"loss", &loss_, r.loss, rule_.loss_threshold},
                                             std::tuple{"grad_norm", &grad_norm_, r.grad_norm, rule_.grad_norm_threshold}}) {
    const double median = window->recent_median();
    const double z = window->judge(x);
    if (z > threshold) {
      log_.report({.step = r.done(), .detector = "spike", .site = site, .magnitude = z, .bound = threshold,
                   .unit = "robust z", .classification = "spike",
                   .detail = str_cat("value ", x, ", median of the last ", rule_.recent, " steps ", median,
                                     "; scale from the step-to-step changes of the last ", rule_.window)},
                  action_, kExitNumeric, "on_spike");
    }
  }
}

nlohmann::json SpikeDetector::save_state() const {
  return {{"loss", loss_.logs()}, {"grad_norm", grad_norm_.logs()}};
}

void SpikeDetector::restore_state(const nlohmann::json& state) {
  loss_.restore(state.at("loss").get<std::vector<double>>());
  grad_norm_.restore(state.at("grad_norm").get<std::vector<double>>());
}

}  // namespace lockstep::detect
