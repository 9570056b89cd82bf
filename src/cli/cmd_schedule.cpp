// `lockstep schedule --pp P --microbatches M [--schedule K] [--virtual-stages V] [--costs F,Bi,W]
// [--p2p T] [--svg FILE] [--json FILE]`: the pipeline schedule the trainer runs for that shape
// (src/parallel/pipeline_schedule.hpp) — each rank's passes in order, a timeline of them with the
// pass costs given, the bubble against the literature's formula and the peak of micro-batches in
// flight per rank; as SVG and JSON on request.
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"
#include "src/parallel/pipeline_schedule.hpp"
#include "verify/svg_plot.hpp"

namespace lockstep::cli {
namespace {

using parallel::Pass;
using parallel::PassKind;

constexpr const char* kScheduleUsage =
    "usage: lockstep schedule --pp P --microbatches M [--schedule gpipe|1f1b|interleaved|zb]\n"
    "                         [--virtual-stages V] [--costs F,Bi,W] [--p2p T] [--svg FILE] [--json FILE]\n"
    "  prints each pipeline rank's passes (F forward, B backward, Bi its input-gradient half, W its\n"
    "  weight-gradient half; micro-batch, and .chunk with virtual stages) in the order the trainer runs\n"
    "  them, a timeline with the pass costs given (default 1,1,1: B = Bi + W = 2 F; p2p time 0), the\n"
    "  bubble against the literature's formula and the peak of micro-batches in flight per rank\n";

std::string label(const Pass& p, int64_t chunks) {
  return str_cat(parallel::pass_letter(p.kind), p.micro, chunks > 1 ? str_cat(".", p.chunk) : "");
}

parallel::PassCosts parse_costs(const std::string& text, const std::string& p2p) {
  const auto number = [](std::string_view item, const std::string& what) {
    double x = 0;
    try {
      size_t used = 0;
      x = std::stod(std::string(item), &used);
      LS_REQUIRE(used == item.size(), "");
    } catch (const std::exception&) {
      throw ConfigError(str_cat("lockstep schedule: ", what, " expects a number, got '", item, "'"));
    }
    LS_REQUIRE(std::isfinite(x) && x >= 0, "lockstep schedule: ", what, " must be >= 0, got ", item);
    return x;
  };
  const auto items = split_commas(text);
  LS_REQUIRE(items.size() == 3, "lockstep schedule: --costs expects F,Bi,W (three numbers), got '", text, "'");
  parallel::PassCosts c{number(items[0], "--costs F"), number(items[1], "--costs Bi"), number(items[2], "--costs W"),
                        number(p2p, "--p2p")};
  LS_REQUIRE(c.forward > 0 && c.backward_input + c.backward_weight > 0,
             "lockstep schedule: --costs F and Bi + W must be > 0");
  return c;
}

// One column a time unit, when every pass starts and ends on a whole unit and the step is short
// enough to read.
void print_timeline(const parallel::PipelineSchedule& s, const parallel::Timeline& t, std::ostream& out) {
  const auto whole = [](double x) { return std::fabs(x - std::round(x)) < 1e-9; };
  bool drawable = t.makespan <= 400;
  size_t width = 2;
  for (const parallel::TimedPass& p : t.passes) {
    drawable = drawable && whole(p.start) && whole(p.end);
    width = std::max(width, label(p.pass, s.chunks).size());
  }
  if (!drawable) {
    out << "timeline: not drawn (passes off whole time units, or longer than 400); see --svg\n";
    return;
  }
  const auto units = static_cast<size_t>(std::lround(t.makespan));
  std::vector<std::vector<std::string>> cells(static_cast<size_t>(s.pp), std::vector<std::string>(units, "."));
  for (const parallel::TimedPass& p : t.passes) {
    const auto start = static_cast<size_t>(std::lround(p.start)), end = static_cast<size_t>(std::lround(p.end));
    for (size_t u = start; u < end; ++u) cells[static_cast<size_t>(p.rank)][u] = u == start ? label(p.pass, s.chunks) : "-";
  }
  out << "timeline (a column a time unit; '-' the pass goes on, '.' idle):\n";
  for (int64_t r = 0; r < s.pp; ++r) {
    out << "rank " << std::setw(2) << r << " |";
    for (const std::string& c : cells[static_cast<size_t>(r)]) out << std::left << std::setw(static_cast<int>(width) + 1) << c;
    out << std::right << "\n";
  }
}

nlohmann::json to_json(const parallel::PipelineSchedule& s, const parallel::PassCosts& c, const parallel::Timeline& t) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int64_t r = 0; r < s.pp; ++r) ranks.push_back(nlohmann::json::array());
  for (const parallel::TimedPass& p : t.passes) {
    ranks[static_cast<size_t>(p.rank)].push_back({{"pass", parallel::pass_letter(p.pass.kind)},
                                                  {"micro", p.pass.micro},
                                                  {"chunk", p.pass.chunk},
                                                  {"stage", s.stage(p.rank, p.pass.chunk)},
                                                  {"start", p.start},
                                                  {"end", p.end}});
  }
  const double formula = parallel::bubble_formula(s.kind, s.pp, s.micro, s.chunks);
  return {{"schedule", parallel::schedule_name(s.kind)},
          {"pp", s.pp},
          {"microbatches", s.micro},
          {"virtual_stages", s.chunks},
          {"costs", {{"F", c.forward}, {"Bi", c.backward_input}, {"W", c.backward_weight}, {"p2p", c.p2p}}},
          {"makespan", t.makespan},
          {"bubble", t.bubble},
          {"bubble_formula", formula >= 0 ? nlohmann::json(formula) : nlohmann::json(nullptr)},
          {"peak_in_flight", t.peak_in_flight},
          {"ranks", ranks}};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  LS_REQUIRE(f.good(), "lockstep schedule: ", path, ": cannot be written");
}

}  // namespace

int cmd_schedule(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kScheduleUsage;
    return 0;
  }
  const auto pp_text = args.take("pp");
  const auto micro_text = args.take("microbatches");
  LS_REQUIRE(pp_text && micro_text, "lockstep schedule: --pp P and --microbatches M are required");
  const int64_t pp = parse_count("lockstep schedule", "pp", *pp_text);
  const int64_t micro = parse_count("lockstep schedule", "microbatches", *micro_text);
  const auto kind = parallel::parse_schedule_kind(args.take_or("schedule", "1f1b"), "lockstep schedule: --schedule");
  const int64_t chunks = parse_count("lockstep schedule", "virtual-stages", args.take_or("virtual-stages", "1"));
  const parallel::PassCosts costs = parse_costs(args.take_or("costs", "1,1,1"), args.take_or("p2p", "0"));
  const std::string svg = args.take_or("svg", ""), json = args.take_or("json", "");
  args.finish("schedule");
  LS_REQUIRE(args.positionals().empty(), "lockstep schedule: unexpected argument '", args.positionals()[0], "'");

  const parallel::PipelineSchedule s = parallel::make_schedule(kind, pp, micro, chunks, "lockstep schedule");
  const parallel::Timeline t = parallel::simulate(s, costs);
  std::cout << "schedule " << parallel::schedule_name(kind) << ": pp " << pp << ", " << micro
            << (micro == 1 ? " micro-batch, " : " micro-batches, ") << chunks << (chunks == 1 ? " chunk" : " chunks")
            << " a rank; costs F " << costs.forward << ", Bi " << costs.backward_input << ", W " << costs.backward_weight
            << " (B = Bi + W), p2p " << costs.p2p << "\n";
  for (int64_t r = 0; r < pp; ++r) {
    std::cout << "rank " << std::setw(2) << r << ":";
    for (const Pass& p : s.ranks[static_cast<size_t>(r)]) std::cout << " " << label(p, chunks);
    std::cout << "\n";
  }
  print_timeline(s, t, std::cout);
  const double formula = parallel::bubble_formula(kind, pp, micro, chunks);
  std::cout << std::fixed << std::setprecision(2) << "bubble " << 100 * t.bubble << "% of pp x makespan";
  if (formula >= 0) std::cout << " (formula " << 100 * formula << "%, for unit costs and no p2p time)";
  std::cout << std::defaultfloat << "; makespan " << t.makespan << "; peak micro-batches in flight by rank:";
  for (int64_t n : t.peak_in_flight) std::cout << " " << n;
  std::cout << "\n";

  if (!json.empty()) write_file(json, to_json(s, costs, t).dump(1) + "\n");
  if (!svg.empty()) {
    std::vector<std::string> rows;
    for (int64_t r = 0; r < pp; ++r) rows.push_back(str_cat("rank ", r));
    std::vector<verify::TimelineBar> bars;
    for (const parallel::TimedPass& p : t.passes) {
      bars.push_back({static_cast<size_t>(p.rank), p.start, p.end, label(p.pass, chunks), static_cast<size_t>(p.pass.kind)});
    }
    write_file(svg, verify::svg_timeline(str_cat("schedule ", parallel::schedule_name(kind), ": pp ", pp, ", ", micro,
                                                 " micro-batches, ", chunks, " chunk(s) a rank; bubble ",
                                                 std::lround(1000 * t.bubble) / 10.0, "%"),
                                         rows, {"F", "B", "Bi", "W"}, bars, "time"));
  }
  return 0;
}

}  // namespace lockstep::cli
