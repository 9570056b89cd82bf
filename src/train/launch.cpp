#include "src/train/launch.hpp"

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/child_process.hpp"
#include "src/core/comma_list.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep {

namespace {

// The job's process group, for the signal handler to pass a stop on (0: none running).
std::atomic<pid_t> g_job{0};
std::atomic<int> g_stop{0};

extern "C" void pass_stop_on(int sig) {
  g_stop.store(sig);
  const pid_t job = g_job.load();
  if (job > 0) ::kill(-job, sig);
}

// What the supervisor reads from the job's output.
struct JobProgress {
  int64_t last_step = 0;             // the last "step N/M" or "stopped ... after step N" line's N
  int64_t last_checkpoint = 0;       // the last "checkpoint .../step_N" line's N
  std::optional<int64_t> resumed;    // "resumed from DIR (step K; ..."
  std::string finding;               // the last line of a detector's finding or stop
  std::vector<int> named;            // the job ranks of the last slow-rank finding or persistent fault
  std::chrono::steady_clock::time_point resumed_at;
};

void read_line(std::string_view line, JobProgress& p) {
  static const std::regex kStep(R"(^step\s+(\d+)/\d+ )");
  static const std::regex kCheckpoint(R"(^checkpoint \S*step_(\d+) )");
  static const std::regex kResumed(R"(^resumed from \S+ \(step (\d+)[;)])");
  static const std::regex kStopped(R"(^stopped (?:by signal \d+ )?after step (\d+) )");
  const std::string s(line);
  std::smatch m;
  if (std::regex_search(s, m, kStep) || std::regex_search(s, m, kStopped)) {
    p.last_step = std::stoll(m[1]);
  } else if (std::regex_search(s, m, kCheckpoint)) {
    p.last_checkpoint = std::stoll(m[1]);
    p.last_step = std::max(p.last_step, p.last_checkpoint);  // step lines may be fewer ([log] every)
  } else if (std::regex_search(s, m, kResumed)) {
    p.resumed = std::stoll(m[1]);
    p.resumed_at = std::chrono::steady_clock::now();
  } else if (s.rfind("finding:", 0) == 0 || s.find("persistent") != std::string::npos) {
    p.finding = s;
    static const std::regex kNamed(R"((?:detector straggler, .*|persistent fault: .*; )ranks ([0-9]+(?:,[0-9]+)*))");
    if (std::regex_search(s, m, kNamed)) {
      p.named.clear();
      for (std::string_view r : split_commas(m[1].str())) p.named.push_back(std::stoi(std::string(r)));
    }
  }
}

// "exit 4 (the watchdog: a collective did not complete)", "killed by signal 9".
std::string describe_exit(const ChildExit& e) {
  if (e.signaled) return str_cat("killed by signal ", e.status - 128, " (", strsignal(e.status - 128), ")");
  switch (e.status) {
    case comm::kExitWatchdog: return "exit 4 (the watchdog: a collective did not complete in time)";
    case comm::kExitMpiError: return "exit 5 (an MPI call failed)";
    case detect::kExitCorruption: return "exit 6 (values that must agree did not)";
    case detect::kExitNumeric: return "exit 7 (a non-finite or spiking loss or gradient norm)";
    case detect::kExitPersistent: return "exit 8 (a persistent fault)";
    case detect::kExitSlowRank: return "exit 9 (a rank persistently slower than its peers)";
    case 2: return "exit 2 (an input error)";
    case 3: return "exit 3 (an internal error)";
    default:
      // mpirun's own status when a rank was killed: 128 + the rank's signal.
      if (e.status > 128 && e.status < 128 + 65) {
        return str_cat("exit ", e.status, " (a process killed by signal ", e.status - 128, ", ", strsignal(e.status - 128), ")");
      }
      return str_cat("exit ", e.status);
  }
}

// Why a restart cannot mend this exit ("" when it can).
std::string not_restartable(const ChildExit& e) {
  if (e.signaled) return "";
  switch (e.status) {
    case 2: return "the same command would meet the same input error";
    case 3: return "an internal error of Lockstep is not mended by a restart";
    case detect::kExitNumeric: return "a restart from the last checkpoint would meet the same values";
    case detect::kExitPersistent: return "a persistent fault stays with its rank; take the rank's device out";
    case detect::kExitSlowRank: return "a slow rank stays slow on its device; --spares N keeps processes to take its place";
    default: return "";
  }
}

// The job's processes (launcher ranks) in job-rank order, and the spares not used yet.
class ProcessPlaces {
 public:
  ProcessPlaces(int ranks, int spares) : listed_(spares > 0) {
    for (int p = 0; p < ranks + spares; ++p) (p < ranks ? active_ : spares_).push_back(p);
  }
  // Spares were given: the job is told its processes.
  bool listed() const { return listed_; }

  // Gives each job rank in `named` the next spare; the records of the moves, or none (nothing
  // moved) when a rank is not the job's or the spares do not suffice.
  nlohmann::json replace(const std::vector<int>& named) {
    std::vector<int> ranks = named;
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    if (ranks.empty() || ranks.size() > spares_.size() || ranks.back() >= static_cast<int>(active_.size())) return {};
    nlohmann::json moves = nlohmann::json::array();
    for (int r : ranks) {
      const int by = spares_.front();
      spares_.erase(spares_.begin());
      moves.push_back({{"rank", r}, {"process", active_[static_cast<size_t>(r)]}, {"by", by}});
      taken_out_.push_back(active_[static_cast<size_t>(r)]);
      active_[static_cast<size_t>(r)] = by;
    }
    return moves;
  }

  // LOCKSTEP_ACTIVE_RANKS for the next attempt, set in this process for the job to inherit.
  void export_to_job() const { ::setenv("LOCKSTEP_ACTIVE_RANKS", detect::ranks_text(active_).c_str(), 1); }
  std::string text() const {
    return str_cat("ranks 0-", active_.size() - 1, " on processes ", detect::ranks_text(active_), "; spare processes ",
                   spares_.empty() ? "none left" : detect::ranks_text(spares_),
                   taken_out_.empty() ? "" : "; taken out " + detect::ranks_text(taken_out_));
  }

 private:
  bool listed_;
  std::vector<int> active_, spares_, taken_out_;
};

class RestartLog {
 public:
  explicit RestartLog(const std::string& path) {
    if (path.empty()) return;
    file_.open(path, std::ios::app);
    LS_REQUIRE(file_.good(), "lockstep launch: --log ", path, ": cannot be opened for appending");
  }
  void write(const nlohmann::json& record) {
    if (file_.is_open()) file_ << record.dump() << "\n" << std::flush;
  }

 private:
  std::ofstream file_;
};

}  // namespace

int launch(const LaunchOptions& opt, std::ostream& out) {
  LS_REQUIRE(!opt.command.empty(), "lockstep launch: no job command after --");
  LS_REQUIRE(opt.max_restarts >= 0, "lockstep launch: --max-restarts must be >= 0, got ", opt.max_restarts);
  LS_REQUIRE(opt.backoff_s >= 0 && std::isfinite(opt.backoff_s), "lockstep launch: --backoff must be >= 0 seconds");
  RestartLog log(opt.log);
  struct sigaction sa {};
  sa.sa_handler = pass_stop_on;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  // The restart waiting for its job to resume, recorded once it has (or once its job ends).
  std::optional<nlohmann::json> pending;
  const auto record_pending = [&](const JobProgress& p) {
    if (!pending) return;
    nlohmann::json& r = *pending;
    const auto failed_at = std::chrono::steady_clock::time_point(
        std::chrono::nanoseconds(r["failed_at_ns"].get<int64_t>()));
    r.erase("failed_at_ns");
    r["resumed_step"] = p.resumed.value_or(0);
    r["steps_lost"] = r["last_step"].get<int64_t>() - p.resumed.value_or(0);
    r["seconds_to_resume"] = p.resumed ? nlohmann::json(std::chrono::duration<double>(p.resumed_at - failed_at).count())
                                       : nlohmann::json(nullptr);
    log.write(r);
    const auto lost = r["steps_lost"].get<int64_t>();
    out << "launch: attempt " << r["attempt"] << " resumed from step " << r["resumed_step"] << " (" << lost
        << (lost == 1 ? " step lost" : " steps lost");
    if (p.resumed) out << ", " << std::fixed << std::setprecision(1) << r["seconds_to_resume"].get<double>() << " s after the failure";
    out << ")\n" << std::flush;
    pending.reset();
  };

  LS_REQUIRE(opt.spares >= 0 && (opt.spares == 0 || opt.ranks >= 1), "lockstep launch: --spares needs --np");
  ProcessPlaces places(opt.ranks, opt.spares);
  if (places.listed()) out << "launch: " << places.text() << "\n" << std::flush;

  for (int attempt = 1;; ++attempt) {
    if (places.listed()) places.export_to_job();
    JobProgress progress;
    const ChildExit e = run_child_lines(
        opt.command, [](pid_t pid) { g_job.store(pid); },
        [&](std::string_view line) {
          out << line << "\n" << std::flush;
          read_line(line, progress);
          if (progress.resumed && pending) record_pending(progress);
        });
    g_job.store(0);
    record_pending(progress);
    if (e.status == 0 && !e.signaled) {
      out << "launch: the job finished"
          << (attempt > 1 ? str_cat(" after ", attempt - 1, attempt == 2 ? " restart" : " restarts") : "") << "\n";
      return 0;
    }
    const std::string cause = describe_exit(e);
    if (const int sig = g_stop.load(); sig != 0) {
      out << "launch: stopped by signal " << sig << " (" << strsignal(sig) << "), passed on to the job, which ended with "
          << (e.signaled ? cause : str_cat("exit ", e.status)) << "; not restarted\n";
      return e.status;
    }
    // A slow or faulty rank named, and spares to take its place: restarted without it.
    nlohmann::json moves;
    if (!e.signaled && (e.status == detect::kExitSlowRank || e.status == detect::kExitPersistent) && places.listed()) {
      moves = places.replace(progress.named);
      if (moves.empty()) {
        out << "launch: the job ended with " << cause << "; not restarted: "
            << (progress.named.empty() ? "its output named no rank"
                                       : str_cat("no spare process for rank(s) ", detect::ranks_text(progress.named)))
            << " (" << places.text() << ")\n";
        return e.status;
      }
    }
    if (const std::string why = not_restartable(e); moves.empty() && !why.empty()) {
      out << "launch: the job ended with " << cause << "; not restarted: " << why
          << (progress.finding.empty() ? "" : " (" + progress.finding + ")") << "\n";
      return e.status;
    }
    if (attempt > opt.max_restarts) {
      out << "launch: the job ended with " << cause << " at step " << progress.last_step << "; " << opt.max_restarts
          << " restarts used, giving up\n";
      return e.status;
    }
    const double wait = std::min(60.0, opt.backoff_s * std::pow(2.0, attempt - 1));
    for (const nlohmann::json& mv : moves) {
      out << "launch: rank " << mv["rank"] << " moves from process " << mv["process"] << " to spare process " << mv["by"]
          << "; " << places.text() << "\n";
    }
    out << "launch: the job ended with " << cause << " at step " << progress.last_step << " (last checkpoint step "
        << progress.last_checkpoint << "); restart " << attempt << " of " << opt.max_restarts << " in " << std::fixed
        << std::setprecision(1) << wait << " s\n"
        << std::flush;
    const auto failed_at = std::chrono::steady_clock::now();
    pending = nlohmann::json{{"event", "restart"},
                             {"attempt", attempt + 1},
                             {"cause", cause},
                             {"exit_status", e.status},
                             {"signaled", e.signaled},
                             {"last_step", progress.last_step},
                             {"last_checkpoint_step", progress.last_checkpoint},
                             {"backoff_s", wait},
                             {"replaced", moves.empty() ? nlohmann::json::array() : moves},
                             {"failed_at_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  failed_at.time_since_epoch()).count()}};
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    if (g_stop.load() != 0) {
      out << "launch: stopped by signal " << g_stop.load() << " while waiting to restart\n";
      return e.status;
    }
  }
}

}  // namespace lockstep
