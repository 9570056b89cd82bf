// What a detector reports while a run trains (docs/tools.md, "Detectors"): a finding names the
// step, the ranks, the detector, the site, the magnitude seen against its bound and what kind of
// fault it looks like; the run then warns and goes on, or stops with an exit code that says why.
//
// Detectors judge values every rank holds (the reduced loss, the global gradient norm, hashes
// gathered over the world), so every rank reaches the same finding at the same point: world rank 0
// prints it (one line beginning "finding:") and records it in the metrics JSONL, and on "stop" every
// rank throws FaultStop, which the CLI turns into the exit code (src/cli/main.cpp).
// Not here: the detectors (nonfinite.hpp, spikes.hpp, replicas.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::detect {

enum class FaultAction { kWarn, kStop, kRollback };

// "warn" | "stop", and "rollback" where `rollback` allows it (faults; not spikes, which a replay
// from the same state and data repeats); anything else is a ConfigError naming `where`.
FaultAction parse_fault_action(const std::string& text, const std::string& where, bool rollback = false);

// Exit codes of a run stopped on a finding (beside 2 input error, 4 watchdog, 5 MPI error).
inline constexpr int kExitCorruption = 6;  // values that must agree do not (replicas, checksums)
inline constexpr int kExitNumeric = 7;     // a non-finite or spiking loss or gradient norm
inline constexpr int kExitPersistent = 8;  // a fault that every replay of its step meets again
inline constexpr int kExitSlowRank = 9;    // a rank persistently slower than its peers ([verify] on_straggler)

struct Finding {
  int64_t step = 0;         // steps done when it was found (the step is step - 1, 0-based)
  std::vector<int> ranks{};   // world ranks it points at; empty: the whole job (a global value)
  std::string detector{};     // "nonfinite", "spike", "replicas", ...
  std::string site{};         // what was checked: "loss", "grad_norm", "parameters of dp replicas", ...
  double magnitude = 0;     // what was seen, in the detector's unit
  double bound = 0;         // the threshold it was held against
  std::string unit{};         // of magnitude and bound: "value", "robust z", "ranks"
  std::string classification{};  // "numeric", "spike", "corruption"
  std::string detail{};       // the evidence in words (hashes, the window's median)
};

// "0,3" ("all" for none: a finding about the whole job).
std::string ranks_text(const std::vector<int>& ranks);
// "finding: after step 12, detector spike, site loss, ranks all: robust z 9.3 > bound 6 (spike); median ..."
std::string finding_line(const Finding& f);
nlohmann::json finding_json(const Finding& f);

// Thrown on every rank when a finding stops the run.
class FaultStop : public std::runtime_error {
 public:
  FaultStop(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Stops the run on a fault that every run of its step meets (exit 8), naming its ranks for a
// supervisor to exclude: "persistent fault: WHAT; ranks R (exclude the device ...)".
[[noreturn]] void stop_persistent(const std::string& what, const std::vector<int>& ranks);

// What a replay's finding does (src/train/replay.hpp, buddy_replay.hpp), which has corrected a
// transient fault already: "stop" stops, otherwise it warns; for a persistent one (stop_persistent
// after reporting it) it only reports.
inline FaultAction replayed_action(FaultAction configured, bool persistent) {
  return configured == FaultAction::kStop && !persistent ? FaultAction::kStop : FaultAction::kWarn;
}

// Thrown on every rank when a finding rolls the run back to its last snapshot (src/train/rollback.hpp).
class FaultRollback : public std::runtime_error {
 public:
  explicit FaultRollback(Finding f) : std::runtime_error(f.detector + " at " + f.site), finding_(std::move(f)) {}
  const Finding& finding() const { return finding_; }

 private:
  Finding finding_;
};

class FindingLog {
 public:
  // out: world rank 0's console (the other ranks pass a null stream); record: writes one JSONL
  // record (rank 0's metrics; may be empty).
  FindingLog(std::ostream& out, std::function<void(const nlohmann::json&)> record);

  // Every rank calls it with the same finding: rank 0's out gets the line and record the JSON;
  // then kStop throws FaultStop(exit_code), kRollback FaultRollback, and kWarn returns. action_key: the [verify] key that
  // chose the action, for the message.
  void report(const Finding& f, FaultAction action, int exit_code, const std::string& action_key);

  int64_t count() const { return count_; }
  // Also tells `listener` of every finding, before its action (a fault campaign's bookkeeping).
  void listen(std::function<void(const Finding&)> listener) { listener_ = std::move(listener); }

 private:
  std::ostream& out_;
  std::function<void(const nlohmann::json&)> record_;
  std::function<void(const Finding&)> listener_;
  int64_t count_ = 0;
};

}  // namespace lockstep::detect
