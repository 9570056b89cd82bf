// Loss and gradient-norm spikes: a value far above the recent ones, judged on logarithms (both
// quantities move by factors: a gradient norm's noise is multiplicative) against the last `window`
// positive finite values of the same quantity,
//     z = (y − L) / max(1.4826 · MAD(Δ) / √2, 1.4826 · MAD(R), floor),   y = ln x,
// R the last `recent` logs, L their median, Δ the window's successive differences. The
// differences carry the step-to-step noise (√2 times one value's, for independent noise) but not
// the trend, and the recent values' own spread covers noise the differences miss (a sawtooth's
// rare large step). Judged on the window's level and spread instead, a loss still falling fast
// puts its early values in the spread: tiny.toml's clean run showed a one-step jump from 2.78 to
// 15.9 at step 42 scoring z 4.6 that way (missed) against 111 this way, while its other steps stay
// below 2.7 (loss) and 11.7 (gradient norm).
// 1.4826 · MAD estimates a standard deviation and, unlike it, is not dragged by the outliers it is
// meant to find; the floor (a relative change of 10⁻³) keeps a nearly constant history from turning
// every wobble into a spike. Judged once the window holds min_history values, upwards only (a
// falling loss is progress); a finding when z exceeds the quantity's threshold. The gradient
// norm's default is higher than the loss's: clean training has gradient-norm spikes of its own,
// while a flipped exponent bit multiplies a gradient by 2^16 and more. The values are the
// reduced ones, agreed by every rank (the trainer takes the worst of any rank's). Class "spike":
// instability or corrupted data, not proven corruption, so its default action ([verify] on_spike)
// is warn. The windows are the detector's state, kept in checkpoints: a resumed run judges its
// first steps against the history before the restart.
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
  int64_t recent = 10;               // the last values whose median is the level judged against
  double floor = 1e-3;               // floor of the scale (of the logarithms)
};

// The z above of x against `history` (oldest first, at least two values, finite).
double jump_z(std::span<const double> history, double x, int64_t recent, double floor);

// The last `window` values of one quantity and the judgement of the next.
class SpikeWindow {
 public:
  explicit SpikeWindow(const SpikeRule& rule) : rule_(rule) {}
  // The z of ln x when the window holds enough values (else 0); then ln x joins the window if x
  // is positive and finite.
  double judge(double x);
  double recent_median() const;  // of the last `recent` values (not their logarithms)
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
