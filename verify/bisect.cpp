// `lockstep bisect` (bisect.hpp): scan, refine and dump runs of both sides, and the report.
#include "verify/bisect.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/hash.hpp"
#include "src/core/child_process.hpp"
#include "verify/core/compare.hpp"
#include "verify/diff.hpp"
#include "verify/op_bounds.hpp"
#include "verify/op_graph.hpp"
#include "verify/shell_words.hpp"

namespace lockstep::verify {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Config keys bisect sets on every child: a side that sets one itself is refused, because the
// search depends on them.
constexpr const char* kManagedKeys[] = {"train.steps",          "checkpoint.dir",       "checkpoint.every",
                                        "checkpoint.keep",      "log.metrics",          "dump.dir",
                                        "dump.steps",           "dump.tensors",         "train.stop_after"};
// Keys that do not change the trajectory: set unless the side sets them. Evaluation off and a
// configured sgemm peak instead of measuring one at each start (they only cost time), and the
// detectors' findings warn instead of stopping: a planted divergence is what bisect looks for, and
// a side must run all its steps for bisect to find it.
const std::vector<std::pair<std::string, std::string>> kCheapKeys = {
    {"data.val", ""}, {"train.peak_gflops", "1"}, {"verify.on_fault", "warn"}, {"verify.on_spike", "warn"}};

std::string key_of(const std::string& word) {
  if (word.rfind("--", 0) != 0) return "";
  return word.substr(2, word.find('=') == std::string::npos ? std::string::npos : word.find('=') - 2);
}

bool side_sets(const BisectSide& s, const std::string& key) {
  return std::any_of(s.args.begin(), s.args.end(), [&](const std::string& w) { return key_of(w) == key; });
}

// Per-step losses a run wrote to its metrics file: 0-based step -> loss (records carry steps done).
std::map<int64_t, float> read_losses(const std::string& path) {
  std::map<int64_t, float> out;
  std::ifstream in(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(str_cat(path, ":", n, ": not a JSON record: ", e.what()));
    }
    if (!j.contains("loss") || !j.contains("step")) continue;  // evaluation records
    out[j["step"].get<int64_t>() - 1] = static_cast<float>(j["loss"].get<double>());
  }
  return out;
}

// What a checkpoint holds, by digest: enough to tell whether two runs are in the same state.
// Taken from the loaded whole tensors, not the manifest's shard checksums, which depend on the
// layout that wrote them.
struct StateDigest {
  std::map<std::string, std::string> parts;  // "model hash", tensor name -> xxh64 of the tensor, "sampler state"
};

StateDigest read_state(const std::string& root, int64_t step) {
  const std::string dir = root + "/" + ckpt::step_dir_name(step);
  const std::string path = dir + "/" + ckpt::kManifestFile;
  if (!durable_io::exists(path)) throw DataError(str_cat(path, ": missing (the run should have written this checkpoint)"));
  const ckpt::Checkpoint c = ckpt::load(dir);
  StateDigest d;
  d.parts["model hash"] = hex64(ckpt::model_hash(c));
  for (const ckpt::StoredTensor& t : c.tensors) d.parts[t.name] = hex64(t.xxh64);
  try {
    d.parts["sampler state"] = c.state.at("sampler").dump();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str_cat(path, ": malformed checkpoint state: ", e.what()));
  }
  return d;
}

std::vector<std::string> differing(const StateDigest& a, const StateDigest& b) {
  std::vector<std::string> out;
  for (const auto& [k, v] : a.parts) {
    const auto it = b.parts.find(k);
    if (it == b.parts.end() || it->second != v) out.push_back(k);
  }
  for (const auto& [k, v] : b.parts) {
    if (!a.parts.count(k)) out.push_back(k);
  }
  return out;
}

bool same_loss(float a, float b) {
  return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

std::string list_text(const std::vector<std::string>& v, size_t max = 6) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += str_cat(", ... (", v.size(), " in all)");
  return s;
}

// What a failed child said: its `error: ...` lines (under mpirun, each rank's), else its last lines.
std::string failure_text(const std::string& log) {
  std::ifstream in(log);
  std::string line, errors;
  while (std::getline(in, line)) {
    if (line.rfind("error: ", 0) == 0 && errors.find(line) == std::string::npos) errors += line + "\n";
  }
  return errors.empty() ? tail_of_file(log, 8) : errors;
}

std::string float_text(float x) {
  std::ostringstream os;
  os << std::setprecision(9) << x;
  return os.str();
}

class Runner {
 public:
  Runner(const BisectOptions& opt, std::ostream& progress, BisectResult& result)
      : opt_(opt), progress_(progress), result_(result) {}

  // Runs `side` for `phase` in <out>/<side>/<phase>: resumed from checkpoint `from` of
  // `from_root` (0: from scratch), checkpointing every `every` steps (0: none), stopping after step
  // index `stop_after` (-1: at the end of the run), dumping step `dump_step` (-1: no dump).
  // Returns the phase directory.
  std::string run(const BisectSide& side, const std::string& phase, const std::string& from_root, int64_t from,
                  int64_t every, int64_t stop_after, int64_t dump_step) {
    std::string label = side.label;
    std::transform(label.begin(), label.end(), label.begin(), ::tolower);
    const std::string dir = opt_.out + "/" + label + "/" + phase;
    durable_io::make_dirs(dir + "/ckpt");
    if (from > 0) {
      const std::string name = ckpt::step_dir_name(from);
      fs::create_directory_symlink(fs::absolute(from_root + "/" + name), dir + "/ckpt/" + name);
    }
    std::vector<std::string> argv = launcher_words(opt_.launcher, side.np, "--launcher");
    argv.push_back(side.bin);
    argv.push_back("train");
    argv.insert(argv.end(), side.args.begin(), side.args.end());
    argv.push_back("--train.steps=" + std::to_string(opt_.steps));
    argv.push_back("--checkpoint.dir=" + dir + "/ckpt");
    argv.push_back("--checkpoint.every=" + std::to_string(every));
    argv.push_back("--checkpoint.keep=0");
    argv.push_back("--log.metrics=" + dir + "/metrics.jsonl");
    argv.push_back("--dump.dir=" + (dump_step >= 0 ? dir + "/dump" : std::string()));
    if (dump_step >= 0) {
      argv.push_back("--dump.steps=" + std::to_string(dump_step));
      argv.push_back("--dump.tensors=");
    }
    const bool stops = stop_after >= 0 && stop_after + 1 < opt_.steps;
    // The run ends after step `stop_after` as if it were the last (metrics, checkpoint), with the
    // LR schedule of all --steps.
    if (stops) argv.push_back("--train.stop_after=" + std::to_string(stop_after));
    for (const auto& [key, value] : kCheapKeys) {
      if (!side_sets(side, key)) argv.push_back("--" + key + "=" + value);
    }

    BisectRun r{side.label, phase, argv, dir + "/train.log", from, 0, 0};
    progress_ << "bisect: " << side.label << " " << phase << ": steps " << from << ".."
              << (stops ? stop_after : opt_.steps - 1) << (dump_step >= 0 ? " (dumping step " + std::to_string(dump_step) + ")" : "")
              << std::flush;
    const auto t0 = Clock::now();
    const ChildExit e = run_child(argv, r.log);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto losses = read_losses(dir + "/metrics.jsonl");
    const int64_t last = stops ? stop_after : opt_.steps - 1;
    const int64_t recorded = last - from + 1;
    const bool dumped = dump_step < 0 || durable_io::exists(dir + "/dump/manifest.json");
    r.steps_executed = static_cast<int64_t>(losses.size());
    progress_ << ", " << r.steps_executed << " steps in " << std::fixed << std::setprecision(1) << r.seconds
              << " s\n" << std::defaultfloat << std::flush;
    result_.runs.push_back(r);
    result_.steps_executed += r.steps_executed;
    const bool complete = static_cast<int64_t>(losses.size()) == recorded &&
                          (recorded == 0 || (losses.begin()->first == from && losses.rbegin()->first == from + recorded - 1));
    if (e.status != 0 || !complete) {
      throw DataError(str_cat("side ", side.label, " ", phase, " run failed (exit status ", e.status, ", ",
                              losses.size(), " of ", recorded, " steps recorded); its log ", r.log, " says:\n",
                              failure_text(r.log), "command: ", join_shell_words(argv)));
    }
    if (!dumped) {
      throw DataError(str_cat("side ", side.label, " ", phase, " run wrote no dump of step ", dump_step, " (exit status ",
                              e.status, "); its log ", r.log, " says:\n", failure_text(r.log)));
    }
    return dir;
  }

 private:
  const BisectOptions& opt_;
  std::ostream& progress_;
  BisectResult& result_;
};

void check_options(const BisectOptions& o) {
  LS_REQUIRE(o.steps >= 1, "bisect: --steps must be >= 1 (the run's [train] steps), got ", o.steps);
  LS_REQUIRE(o.every >= 0, "bisect: --every must be >= 0 (0: about sqrt(steps)), got ", o.every);
  LS_REQUIRE(!o.out.empty(), "bisect: --out DIR is required");
  LS_REQUIRE(!durable_io::exists(o.out + "/bisect.json") && !durable_io::exists(o.out + "/a"),
             "bisect: --out ", o.out, " already holds a bisect; choose another directory or remove it");
  for (const BisectSide* s : {&o.a, &o.b}) {
    LS_REQUIRE(s->np >= 1, "bisect: --", s->label == "A" ? "a" : "b", "-np must be >= 1, got ", s->np);
    for (const auto& w : s->args) {
      const std::string k = key_of(w);
      for (const char* m : kManagedKeys) {
        LS_REQUIRE(k != m, "bisect: side ", s->label, " sets --", k,
                   ", which bisect sets itself on every run (steps via --steps; checkpoints, metrics, dumps and "
                   "stops in its work directory); remove it");
      }
    }
    LS_REQUIRE(std::find(s->args.begin(), s->args.end(), "--config") != s->args.end() ||
                   std::any_of(s->args.begin(), s->args.end(),
                               [](const std::string& w) { return w.rfind("--config=", 0) == 0; }),
               "bisect: side ", s->label, " has no --config FILE in its arguments");
    LS_REQUIRE(s->bin.find('/') == std::string::npos || ::access(s->bin.c_str(), X_OK) == 0, "bisect: --",
               s->label == "A" ? "a" : "b", "-bin ", s->bin, " is not an executable file");
    if (s->np > 1) {
      LS_REQUIRE(o.launcher.find("{np}") != std::string::npos, "bisect: --launcher \"", o.launcher,
                 "\" must contain {np} (the rank count)");
    }
  }
}

// The dumps of step `step` from both sides, diffed bitwise and, with `bounds` (the checkpoints
// the step started from), against op-local bounds; fills op, op_note, op_detail.
void name_op(const std::string& dump_a, const std::string& dump_b, int64_t step, const ModelDesc& model,
             const BoundsInputs* bounds, BisectResult& r) {
  const DiffReport bitwise = diff_dumps(dump_a, dump_b, DiffMode{});
  if (!bitwise.first_divergent) {
    r.op_note = str_cat("the dumps of step ", step, " agree bitwise in all ", bitwise.tensors.size(),
                        " tensors: the difference is outside the dumped tensors (data, optimizer state)");
    return;
  }
  std::optional<DiffReport> bounded;
  if (bounds) bounded = diff_dumps(dump_a, dump_b, DiffMode{}, bounds);
  // With bounds, the op is the first one outside its bound; if none is, every difference is one a
  // valid fp32 kernel may make, and the first bitwise difference is shown as such.
  const bool out_of_bounds = bounded && bounded->first_divergent.has_value();
  const DiffReport& d = out_of_bounds ? *bounded : bitwise;
  const size_t index = *d.first_divergent;
  const std::string prefix = "step/" + std::to_string(step) + "/";
  std::map<std::string, const TensorDiff*> by_name;
  for (const auto& t : d.tensors) by_name[t.name.substr(prefix.size())] = &t;
  const TensorDiff& first = d.tensors[index];
  r.op = first.name.substr(prefix.size());
  const OpInputs in = op_inputs(r.op, model);
  nlohmann::json inputs = nlohmann::json::array();
  std::vector<std::string> bad;
  std::string listed;
  for (const auto& name : in.tensors) {
    const auto it = by_name.find(name);
    std::string status = "not dumped";
    if (it != by_name.end()) {
      const TensorDiff& t = *it->second;
      status = !t.ok() ? "DIFFERS" : t.bitwise_equal ? "bitwise equal"
                                                     : str_cat("within bounds (A/bound ", t.tight_a, ", B/bound ",
                                                               t.tight_b, ")");
      if (!t.ok()) bad.push_back(name);
    }
    listed += str_cat(listed.empty() ? "" : ", ", name, " (", status, ")");
    inputs.push_back({{"name", name}, {"status", status}});
  }
  r.op_detail = {{"op", in.op}, {"output", d.to_json()["tensors"][index]}, {"inputs", inputs},
                 {"other_inputs", in.other}, {"agreement", bounds ? "op-local bounds" : "bitwise"}};
  std::string verdict;
  if (bounds && out_of_bounds) {
    verdict = str_cat("; output outside its op-local bound on ",
                      first.outside_a > 0 && first.outside_b > 0 ? "both sides" : first.outside_a > 0 ? "side A" : "side B",
                      " (A/bound ", first.tight_a, ", B/bound ", first.tight_b, ")");
  } else if (bounds) {
    const TensorDiff* t = nullptr;
    for (const auto& x : bounded->tensors) {
      if (x.name == first.name) t = &x;
    }
    verdict = str_cat("; every tensor of the step is within its op-local bound on both sides, so this first bitwise "
                      "difference is one a valid fp32 kernel may make (A/bound ", t ? t->tight_a : 0, ", B/bound ",
                      t ? t->tight_b : 0, ", |A-B|/combined bound ", t ? t->tight_diff : 0, ")");
    r.op_detail["within_bounds"] = true;
  }
  r.op_note = str_cat(in.op, "; inputs ", listed.empty() ? "none dumped" : listed,
                      in.other.empty() ? "" : "; also " + in.other,
                      "; parameters and optimizer state before the step: equal (checkpoint digests)", verdict);
  if (!bad.empty()) r.warnings.push_back("inputs of " + r.op + " differ: " + list_text(bad));
}

}  // namespace

int64_t default_bisect_every(int64_t steps) {
  return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(steps))));
}

BisectResult bisect(const BisectOptions& opt, std::ostream& progress) {
  check_options(opt);
  BisectResult r;
  const auto t0 = Clock::now();
  r.every = opt.every > 0 ? opt.every : default_bisect_every(opt.steps);
  durable_io::make_dirs(opt.out);
  Runner runner(opt, progress, r);
  const int64_t S = opt.steps, K = r.every;

  // 1. scan
  const std::string scan_a = runner.run(opt.a, "scan", "", 0, K, -1, -1);
  const std::string scan_b = runner.run(opt.b, "scan", "", 0, K, -1, -1);
  const auto loss_a = read_losses(scan_a + "/metrics.jsonl"), loss_b = read_losses(scan_b + "/metrics.jsonl");
  int64_t first_loss = S;  // first step whose loss differs
  for (int64_t s = 0; s < S; ++s) {
    if (!same_loss(loss_a.at(s), loss_b.at(s))) {
      first_loss = s;
      break;
    }
  }
  std::vector<int64_t> ckpts;  // steps done at each scan checkpoint
  for (int64_t c = K; c < S; c += K) ckpts.push_back(c);
  ckpts.push_back(S);
  int64_t first_state = S + 1;  // first checkpoint whose state differs
  for (int64_t c : ckpts) {
    if (c > first_loss + 1) break;
    if (!differing(read_state(scan_a + "/ckpt", c), read_state(scan_b + "/ckpt", c)).empty()) {
      first_state = c;
      break;
    }
  }
  if (first_loss == S && first_state == S + 1) {
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.steps_reexecuted = r.steps_executed - 2 * S;
    durable_io::write_file_atomic(opt.out + "/bisect.json", r.to_json().dump(1) + "\n");
    durable_io::write_file_atomic(opt.out + "/bisect-report.md", r.markdown(opt));
    return r;
  }
  r.diverged = true;

  // 2. refine: the divergent step d satisfies lo <= d <= hi.
  const int64_t hi = std::min(first_loss, first_state - 1);
  const int64_t lo = hi / K * K;  // the last scan checkpoint at or before hi (0: the start)
  int64_t d = hi;
  std::string root_a = scan_a + "/ckpt", root_b = scan_b + "/ckpt";  // where checkpoint d is
  std::vector<std::string> state_diff;
  if (hi > lo) {
    const std::string ra = runner.run(opt.a, "refine", scan_a + "/ckpt", lo, 1, hi, -1);
    const std::string rb = runner.run(opt.b, "refine", scan_b + "/ckpt", lo, 1, hi, -1);
    for (const auto& [dir, scan_losses, label] :
         {std::tuple{ra, &loss_a, "A"}, std::tuple{rb, &loss_b, "B"}}) {
      for (const auto& [s, loss] : read_losses(dir + "/metrics.jsonl")) {
        if (!same_loss(loss, scan_losses->at(s))) {
          r.warnings.push_back(str_cat("side ", label, " does not reproduce itself: step ", s, " loss ",
                                       float_text(loss), " on re-run from checkpoint ", lo, ", ",
                                       float_text(scan_losses->at(s)), " in the scan; its divergence may be "
                                       "run-to-run noise (nondeterministic kernels or threads)"));
          break;
        }
      }
    }
    for (int64_t s = lo; s < hi; ++s) {
      const auto diff = differing(read_state(ra + "/ckpt", s + 1), read_state(rb + "/ckpt", s + 1));
      if (!diff.empty()) {
        d = s;
        state_diff = diff;
        break;
      }
    }
    if (d > lo) root_a = ra + "/ckpt", root_b = rb + "/ckpt";
  }
  if (state_diff.empty() && d + 1 == first_state) {
    state_diff = differing(read_state(scan_a + "/ckpt", first_state), read_state(scan_b + "/ckpt", first_state));
  }
  r.step = d;
  if (d == first_loss) {
    r.why = str_cat("loss ", float_text(loss_a.at(d)), " (A) vs ", float_text(loss_b.at(d)), " (B)");
  } else {
    r.why = str_cat("same loss ", float_text(loss_a.at(d)));
  }
  r.why += state_diff.empty() ? std::string()
                              : str_cat("; state after the step differs in ", list_text(state_diff));

  // 3. dump step d on both sides and name the op.
  try {
    const std::string da = runner.run(opt.a, "dump", root_a, d, 0, d, d);
    const std::string db = runner.run(opt.b, "dump", root_b, d, 0, d, d);
    const Dump dump = read_dump(da + "/dump");
    const ModelDesc model = describe_model(dump_run_config(dump).model);
    const BoundsInputs ckpts{da + "/ckpt", db + "/ckpt"};
    name_op(da + "/dump", db + "/dump", d, model, opt.bounds ? &ckpts : nullptr, r);
  } catch (const DataError& e) {
    r.op_note = e.what();
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.steps_reexecuted = r.steps_executed - 2 * S;
  durable_io::write_file_atomic(opt.out + "/bisect.json", r.to_json().dump(1) + "\n");
  durable_io::write_file_atomic(opt.out + "/bisect-report.md", r.markdown(opt));
  return r;
}

nlohmann::json BisectResult::to_json() const {
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& run : runs) {
    rs.push_back({{"side", run.side}, {"phase", run.phase}, {"from_step", run.from_step},
                  {"steps_executed", run.steps_executed}, {"seconds", run.seconds},
                  {"command", join_shell_words(run.argv)}, {"log", run.log}});
  }
  return {{"diverged", diverged},
          {"step", diverged ? nlohmann::json(step) : nlohmann::json()},
          {"why", why},
          {"op", op.empty() ? nlohmann::json() : nlohmann::json(op)},
          {"op_note", op_note},
          {"op_detail", op_detail},
          {"every", every},
          {"steps_executed", steps_executed},
          {"steps_reexecuted", steps_reexecuted},
          {"seconds", seconds},
          {"runs", rs},
          {"warnings", warnings}};
}

void BisectResult::print_summary(std::ostream& os) const {
  if (!diverged) {
    os << "bisect: no divergence: losses and checkpoint states agree at every step";
  } else {
    os << "bisect: first divergent step " << step << " (" << why << ")\n";
    os << (op.empty() ? "bisect: no op named: " : "bisect: first divergent op " + op + ": ") << op_note;
  }
  os << "\nbisect: " << steps_executed << " steps executed (" << steps_reexecuted
     << " beyond one pass of each side), " << runs.size() << " runs, " << std::fixed << std::setprecision(1)
     << seconds << " s\n" << std::defaultfloat;
  for (const auto& w : warnings) os << "warning: " << w << "\n";
}

std::string BisectResult::markdown(const BisectOptions& opt) const {
  std::ostringstream md;
  md << "# lockstep bisect\n\n";
  md << "- A: `" << join_shell_words(opt.a.args) << "`" << (opt.a.np > 1 ? str_cat(" on ", opt.a.np, " ranks") : "")
     << "\n- B: `" << join_shell_words(opt.b.args) << "`" << (opt.b.np > 1 ? str_cat(" on ", opt.b.np, " ranks") : "")
     << "\n- " << opt.steps << " steps, scan checkpoints every " << every << " steps, agreement: "
     << (opt.bounds ? "within derived bounds" : "bitwise") << "\n\n";
  if (!diverged) {
    md << "## Result: no divergence\n\nThe losses of all " << opt.steps
       << " steps and the state at every checkpoint (model hash, every parameter and AdamW moment, sampler) agree.\n\n";
  } else {
    md << "## Result: step " << step << ", op `" << (op.empty() ? "not named" : op) << "`\n\n";
    md << "- step " << step << " (0-based, as in dump names `step/" << step << "/...`): " << why << "\n";
    md << "- the state before step " << step << " agrees on both sides\n";
    md << "- op: " << op_note << "\n\n";
    if (op_detail.contains("output")) {
      const auto& o = op_detail["output"];
      md << "| tensor | status | mismatching | max abs err | max rel err | max ulp | first mismatch |\n"
         << "|---|---|---|---|---|---|---|\n";
      md << "| `" << o["name"].get<std::string>() << "` | differs | " << o["mismatches"] << "/" << o["count"] << " | "
         << o["max_abs_err"] << " | " << o["max_rel_err"] << " | " << o["max_ulp"] << " | "
         << (o.contains("first_mismatch") ? o["first_mismatch"].dump() : "") << " |\n";
      if (o.contains("bounds")) {
        const auto& b = o["bounds"];
        md << "| (op-local bounds) | A/bound " << b["tightness_a"] << ", B/bound " << b["tightness_b"]
           << " | outside: A " << b["outside_a"] << ", B " << b["outside_b"] << " | abs(A-B) / (boundA + boundB + "
           << "abs(exactA - exactB)) " << b["tightness_diff"] << " | largest combined bound " << b["max_bound"]
           << " | | |\n";
      }
      for (const auto& i : op_detail["inputs"]) {
        md << "| `" << i["name"].get<std::string>() << "` (input) | " << i["status"].get<std::string>()
           << " | | | | | |\n";
      }
      md << "\n";
    }
  }
  for (const auto& w : warnings) md << "**warning:** " << w << "\n\n";
  md << "## Cost\n\n" << steps_executed << " steps executed in " << runs.size() << " runs ("
     << steps_reexecuted << " beyond one pass of each side over the " << opt.steps << " steps), "
     << std::fixed << std::setprecision(1) << seconds << " s.\n\n";
  md << "| side | phase | from step | steps executed | seconds |\n|---|---|---|---|---|\n";
  for (const auto& run : runs) {
    md << "| " << run.side << " | " << run.phase << " | " << run.from_step << " | " << run.steps_executed << " | "
       << std::setprecision(1) << run.seconds << " |\n";
  }
  md << "\n## Reproduce\n\nThe whole search (into a new directory):\n\n```sh\nlockstep bisect --a="
     << quote_shell_word(join_shell_words(opt.a.args)) << " --b=" << quote_shell_word(join_shell_words(opt.b.args))
     << " --steps=" << opt.steps << " --every=" << every << (opt.bounds ? " --bounds" : "")
     << (opt.a.np > 1 ? str_cat(" --a-np=", opt.a.np) : "") << (opt.b.np > 1 ? str_cat(" --b-np=", opt.b.np) : "")
     << " --out=" << quote_shell_word(opt.out + "-again") << "\n```\n\n"
     << "Each run, as started (logs next to each run's checkpoints; refine and dump runs resume from a link to "
        "the checkpoint they start from, so re-running one needs a fresh --dump.dir):\n\n```sh\n";
  for (const auto& run : runs) md << join_shell_words(run.argv) << "\n";
  md << "```\n";
  if (diverged && !op.empty()) {
    md << "\nCompare the dumps of step " << step << ":\n\n```sh\nlockstep diff " << opt.out << "/a/dump/dump "
       << opt.out << "/b/dump/dump\n```\n";
  }
  return md.str();
}

}  // namespace lockstep::verify
