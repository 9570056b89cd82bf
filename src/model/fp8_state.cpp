#include "src/model/fp8_state.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <stdexcept>

#include "src/core/check.hpp"

namespace lockstep {

namespace {

constexpr size_t kCounts = 7;  // numel, saturated, underflowed, nonzero, nonfinite, err_sq, bound_sq

}  // namespace

void Fp8TensorStats::add(const Fp8Counts& c, int64_t n) {
  amax = larger_amax(amax, c.amax);
  numel += static_cast<double>(n);
  saturated += static_cast<double>(c.saturated);
  underflowed += static_cast<double>(c.underflowed);
  nonzero += static_cast<double>(c.nonzero);
  nonfinite += static_cast<double>(c.nonfinite);
  err_sq += c.err_sq;
  bound_sq += c.bound_sq;
}

Fp8State::Fp8State(const Fp8Recipe& recipe, const std::vector<std::string>& linears) : recipe_(recipe) {
  for (const std::string& l : linears) {
    for (Fp8Role r : kFp8Roles) tensors_.push_back({.name = l + "/" + fp8_role_name(r), .role = r});
  }
}

size_t Fp8State::index(const std::string& linear, Fp8Role role) const {
  const std::string name = linear + "/" + fp8_role_name(role);
  const size_t i = find(name);
  LS_CHECK(i != SIZE_MAX, "no fp8 tensor ", name);
  return i;
}

size_t Fp8State::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return i;
  }
  return SIZE_MAX;
}

void Fp8State::record(size_t i, const Fp8Counts& c, int64_t numel) {
  Tensor& t = tensors_[i];
  if (t.stale) {
    t.step = {};
    t.stale = false;
  }
  t.step.add(c, numel);
}

std::vector<float> Fp8State::step_amax() const {
  std::vector<float> out;
  for (const Tensor& t : tensors_) out.push_back(t.stale ? 0.0f : t.step.amax);
  return out;
}

std::vector<double> Fp8State::step_counts() const {
  std::vector<double> out;
  for (const Tensor& t : tensors_) {
    const Fp8TensorStats s = t.stale ? Fp8TensorStats{} : t.step;
    out.insert(out.end(), {s.numel, s.saturated, s.underflowed, s.nonzero, s.nonfinite, s.err_sq, s.bound_sq});
  }
  return out;
}

void Fp8State::set_step_stats(const std::vector<float>& amax, const std::vector<double>& counts) {
  LS_CHECK(amax.size() == tensors_.size() && counts.size() == kCounts * tensors_.size(), "fp8 statistics of ",
           amax.size(), " tensors for ", tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const double* c = counts.data() + kCounts * i;
    tensors_[i].step = {amax[i], c[0], c[1], c[2], c[3], c[4], c[5], c[6]};
    tensors_[i].stale = false;
  }
}

void Fp8State::finish_step() {
  ++generation_;
  for (Tensor& t : tensors_) {
    if (t.stale) t.step = {};  // nothing recorded since the last step: amax 0
    t.stale = true;
    t.last_scale = t.scale;
    t.last_from_data = recipe_.scaling != Fp8Scaling::kDelayed || !t.history.empty();
    if (recipe_.scaling != Fp8Scaling::kDelayed) continue;
    t.history.push_back(t.step.amax);
    if (static_cast<int64_t>(t.history.size()) > recipe_.amax_history_len) t.history.erase(t.history.begin());
    float amax = t.history.back();
    if (recipe_.amax_max) {
      for (float a : t.history) amax = larger_amax(amax, a);
    }
    t.scale = fp8_scale(amax, recipe_.format(t.role), static_cast<int>(recipe_.margin), recipe_.power_of_two, t.scale);
  }
}

nlohmann::json Fp8State::save() const {
  nlohmann::json tensors = nlohmann::json::array();
  for (const Tensor& t : tensors_) {
    // Floats as their bit patterns: NaN and inf survive JSON, and the bits are the state.
    std::vector<uint32_t> history;
    for (float a : t.history) history.push_back(std::bit_cast<uint32_t>(a));
    tensors.push_back({{"name", t.name}, {"scale", std::bit_cast<uint32_t>(t.scale)}, {"amax_history", history}});
  }
  return {{"recipe", fp8_scaling_name(recipe_.scaling)}, {"tensors", tensors}};
}

void Fp8State::restore(const nlohmann::json& j) {
  ++generation_;
  const std::string recipe = j.value("recipe", std::string());
  if (recipe != fp8_scaling_name(recipe_.scaling)) {
    throw std::runtime_error(str_cat("fp8 state of recipe \"", recipe, "\", this run's is \"",
                                     fp8_scaling_name(recipe_.scaling), "\""));
  }
  const nlohmann::json& tensors = j.at("tensors");
  if (tensors.size() != tensors_.size()) {
    throw std::runtime_error(str_cat("fp8 state of ", tensors.size(), " tensors, this model has ", tensors_.size()));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    Tensor& t = tensors_[i];
    const nlohmann::json& s = tensors[i];
    if (s.at("name").get<std::string>() != t.name) {
      throw std::runtime_error(str_cat("fp8 state tensor ", i, " is ", s.at("name").get<std::string>(), ", expected ", t.name));
    }
    t.scale = t.last_scale = std::bit_cast<float>(s.at("scale").get<uint32_t>());
    t.history.clear();
    for (uint32_t b : s.at("amax_history").get<std::vector<uint32_t>>()) t.history.push_back(std::bit_cast<float>(b));
    t.last_from_data = !t.history.empty();
    t.step = {};
    t.stale = true;
  }
}

}  // namespace lockstep
