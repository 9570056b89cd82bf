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

}  // namespace

double robust_z(std::span<const double> history, double x, double floor) {
  LS_CHECK(!history.empty());
  const double m = median_of({history.begin(), history.end()});
  std::vector<double> dev(history.size());
  std::transform(history.begin(), history.end(), dev.begin(), [m](double h) { return std::fabs(h - m); });
  const double scale = std::max(1.4826 * median_of(std::move(dev)), floor);
  if (scale == 0) return x > m ? INFINITY : 0.0;
  return (x - m) / scale;
}

double SpikeWindow::judge(double x) {
  if (!(x > 0 && std::isfinite(x))) return 0;
  const double y = std::log(x);
  const double z = static_cast<int64_t>(logs_.size()) >= rule_.min_history ? robust_z(logs_, y, rule_.floor) : 0;
  if (static_cast<int64_t>(logs_.size()) < rule_.window) {
    logs_.push_back(y);
  } else {
    logs_[static_cast<size_t>(next_)] = y;
    next_ = (next_ + 1) % rule_.window;
  }
  return z;
}

double SpikeWindow::median() const { return logs_.empty() ? 0.0 : std::exp(median_of(logs_)); }

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
    const double median = window->median();
    const double z = window->judge(x);
    if (z > threshold) {
      log_.report({.step = r.done(), .detector = "spike", .site = site, .magnitude = z, .bound = threshold,
                   .unit = "robust z", .classification = "spike",
                   .detail = str_cat("value ", x, ", median of the last ", rule_.window, " steps ", median)},
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
