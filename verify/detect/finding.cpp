#include "verify/detect/finding.hpp"

#include <cmath>
#include <sstream>

#include "src/core/check.hpp"

namespace lockstep::detect {

FaultAction parse_fault_action(const std::string& text, const std::string& where, bool rollback) {
  if (text == "warn") return FaultAction::kWarn;
  if (text == "stop") return FaultAction::kStop;
  if (text == "rollback" && rollback) return FaultAction::kRollback;
  LS_REQUIRE(text != "rollback", where, ": \"rollback\" is for faults (on_fault): a spike replayed from the same ",
             "state and data spikes again; expected \"stop\" or \"warn\"");
  throw ConfigError(str_cat(where, ": expected ", rollback ? "\"rollback\", " : "", "\"stop\" or \"warn\", got \"",
                            text, "\""));
}

namespace {

nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

}  // namespace

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "all";
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

std::string finding_line(const Finding& f) {
  std::ostringstream s;
  s.precision(4);
  s << "finding: after step " << f.step << ", detector " << f.detector << ", site " << f.site << ", ranks "
    << ranks_text(f.ranks) << ": " << f.unit << " " << f.magnitude << " against bound " << f.bound << " ("
    << f.classification << ")";
  if (!f.detail.empty()) s << "; " << f.detail;
  return s.str();
}

nlohmann::json finding_json(const Finding& f) {
  return {{"finding",
           {{"step", f.step},
            {"ranks", f.ranks},
            {"detector", f.detector},
            {"site", f.site},
            {"magnitude", number(f.magnitude)},
            {"bound", number(f.bound)},
            {"unit", f.unit},
            {"classification", f.classification},
            {"detail", f.detail}}}};
}

void stop_persistent(const std::string& what, const std::vector<int>& ranks) {
  throw FaultStop(str_cat("persistent fault: ", what, "; ranks ", ranks_text(ranks),
                          " (exclude the device and restart from the last checkpoint)"),
                  kExitPersistent);
}

FindingLog::FindingLog(std::ostream& out, std::function<void(const nlohmann::json&)> record)
    : out_(out), record_(std::move(record)) {}

void FindingLog::report(const Finding& f, FaultAction action, int exit_code, const std::string& action_key) {
  ++count_;
  out_ << finding_line(f) << std::endl;
  if (record_) record_(finding_json(f));
  if (listener_) listener_(f);
  if (action == FaultAction::kRollback) throw FaultRollback(f);
  if (action == FaultAction::kStop) {
    throw FaultStop(str_cat("stopped after step ", f.step, " on the ", f.detector, " finding at ", f.site, " ([verify] ",
                            action_key, " = \"stop\"; \"warn\" would go on)"),
                    exit_code);
  }
}

}  // namespace lockstep::detect
