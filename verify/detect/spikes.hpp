// Loss and gradient-norm spikes: a value far above the recent ones, by a robust z-score of its
// logarithm over the logarithms of the last `window` positive finite values of the same quantity,
//     z = (y − median) / max(1.4826 · MAD, floor),   y = ln x,   MAD = median |y_i − median|.
// Logarithms, because both quantities move by factors (a gradient norm's noise is multiplicative:
// on raw values its long upper tail reads as spikes); 1.4826 · MAD estimates the standard deviation
// of normal data and, unlike it, is not dragged by the outliers it is meant to find; the floor (a
// relative change of 10⁻³) keeps a nearly constant history from turning every wobble into a spike.
// Judged once the window holds min_history values, upwards only (a falling loss is progress); a
// finding when z exceeds the quantity's threshold. The gradient norm's default is higher than the
// loss's: clean training has gradient-norm spikes of its own — runs of the tiny model over 10,100
// steps showed robust z up to 10.6 (values up to 660 times the window's median early in training)
// with no loss spike above 6 — while a flipped exponent bit multiplies a gradient by 2^16 and more.
// The values are the reduced ones, equal on every rank. Class "spike": instability or corrupted
// data, not proven corruption, so its default action ([verify] on_spike) is warn. The windows are
// the detector's state, kept in checkpoints: a resumed run judges its first steps against the
// history before the restart.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

struct SpikeRule {
  int64_t window = 50;               // values kept per quantity
  double loss_threshold = 6;         // robust z above which a loss is a spike
  double grad_norm_threshold = 20;   // ... a gradient norm
  int64_t min_history = 10;          // values needed before judging
  double floor = 1e-3;               // floor of the scale (of the logarithms)
};

// (x − median) / max(1.4826 · MAD, floor) over `history` (non-empty, finite).
double robust_z(std::span<const double> history, double x, double floor);

// The last `window` values of one quantity and the judgement of the next.
class SpikeWindow {
 public:
  explicit SpikeWindow(const SpikeRule& rule) : rule_(rule) {}
  // The robust z of ln x when the window holds enough values (else 0); then ln x joins the window
  // if x is positive and finite.
  double judge(double x);
  double median() const;  // of the values (not their logarithms)
  // The logarithms in the window, oldest first; restore() takes them back.
  std::vector<double> logs() const;
  void restore(const std::vector<double>& logs);

 private:
  SpikeRule rule_;
  std::vector<double> logs_;  // a ring of the logarithms of the last `window` values
  int64_t next_ = 0;
};

class SpikeDetector final : public StepObserver {
 public:
  SpikeDetector(const SpikeRule& rule, FindingLog& log, FaultAction action)
      : rule_(rule), loss_(rule), grad_norm_(rule), log_(log), action_(action) {}
  void end_step(const StepRecord& r) override;
  std::string state_key() const override { return "spikes"; }
  nlohmann::json save_state() const override;  // {"loss": [logs], "grad_norm": [logs]}
  void restore_state(const nlohmann::json& state) override;

 private:
  SpikeRule rule_;
  SpikeWindow loss_, grad_norm_;
  FindingLog& log_;
  FaultAction action_;
};

}  // namespace lockstep::detect
