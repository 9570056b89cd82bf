#include "src/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "src/core/check.hpp"

namespace lockstep::parallel {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGpipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZeroBubble: return "zb";
  }
  throw InternalError("schedule_name: unknown ScheduleKind");
}

ScheduleKind parse_schedule_kind(const std::string& text, const std::string& where) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                         ScheduleKind::kZeroBubble}) {
    if (text == schedule_name(k)) return k;
  }
  throw ConfigError(str_cat(where, ": expected \"gpipe\", \"1f1b\", \"interleaved\" or \"zb\", got \"", text, "\""));
}

const char* pass_letter(PassKind k) {
  switch (k) {
    case PassKind::kForward: return "F";
    case PassKind::kBackward: return "B";
    case PassKind::kBackwardInput: return "Bi";
    case PassKind::kBackwardWeight: return "W";
  }
  throw InternalError("pass_letter: unknown PassKind");
}

namespace {

std::vector<Pass> gpipe(int64_t m) {
  std::vector<Pass> passes;
  passes.reserve(static_cast<size_t>(2 * m));
  for (int64_t i = 0; i < m; ++i) passes.push_back({PassKind::kForward, i, 0});
  for (int64_t i = 0; i < m; ++i) passes.push_back({PassKind::kBackward, i, 0});
  return passes;
}

// 1F1B, plain (v = 1) or interleaved: the k-th forward and k-th backward of the rank's m·v
// (chunk, micro-batch) passes, in Megatron's order.
std::vector<Pass> one_f_one_b(int64_t p, int64_t m, int64_t v, int64_t rank) {
  const int64_t total = m * v;
  const auto micro = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  const auto chunk = [&](int64_t k, bool forward) {
    const auto c = static_cast<int>((k % (p * v)) / p);
    return forward ? c : static_cast<int>(v) - 1 - c;
  };
  // (With v = 1: micro-batch k, chunk 0.)
  const auto f = [&](int64_t k) { return Pass{PassKind::kForward, micro(k), chunk(k, true)}; };
  const auto b = [&](int64_t k) { return Pass{PassKind::kBackward, micro(k), chunk(k, false)}; };
  const int64_t warmup = std::min(total, v == 1 ? p - rank - 1 : (p - rank - 1) * 2 + (v - 1) * p);
  std::vector<Pass> passes;
  passes.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) passes.push_back(f(k));
  for (int64_t k = 0; k < total - warmup; ++k) {
    passes.push_back(f(warmup + k));
    passes.push_back(b(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) passes.push_back(b(k));
  return passes;
}

// ZB-H1 by list scheduling on unit costs: at each time unit a free rank runs, in this order of
// preference, its next Bi (micro-batch order, once its forward is done and the next stage's Bi
// has ended), its next forward (once the previous stage's has ended, while fewer than p − rank
// micro-batches are between their forward and their Bi — 1F1B's peak — and fewer than
// 2p − rank − 1 have not had their W), or its oldest waiting W. The second bound keeps the W's
// that wait after the forward's peak to p − 1 (those the cooldown needs), whatever the number of
// micro-batches.
std::vector<std::vector<Pass>> zero_bubble(int64_t p, int64_t m) {
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // End times of each rank's forward and Bi of each micro-batch (kNever: not run yet).
  std::vector<std::vector<int64_t>> f_end(static_cast<size_t>(p), std::vector<int64_t>(static_cast<size_t>(m), kNever));
  std::vector<std::vector<int64_t>> b_end = f_end;
  std::vector<std::vector<Pass>> order(static_cast<size_t>(p));
  std::vector<int64_t> next_f(static_cast<size_t>(p), 0), next_b(static_cast<size_t>(p), 0),
      busy_until(static_cast<size_t>(p), 0);
  std::vector<std::deque<int64_t>> waiting_w(static_cast<size_t>(p));
  const int64_t passes = 3 * m * p;
  int64_t placed = 0;
  for (int64_t t = 0; placed < passes; ++t) {
    LS_CHECK(t <= 3 * m * p + 3 * p, "zero-bubble list scheduling did not finish (p ", p, ", m ", m, ")");
    for (int64_t r = 0; r < p; ++r) {
      const auto R = static_cast<size_t>(r);
      if (busy_until[R] > t) continue;
      const int64_t b = next_b[R], f = next_f[R];
      if (b < m && f_end[R][static_cast<size_t>(b)] <= t &&
          (r == p - 1 || b_end[R + 1][static_cast<size_t>(b)] <= t)) {
        order[R].push_back({PassKind::kBackwardInput, b, 0});
        b_end[R][static_cast<size_t>(b)] = t + 1;
        waiting_w[R].push_back(b);
        ++next_b[R];
      } else if (f < m && (r == 0 || f_end[R - 1][static_cast<size_t>(f)] <= t) && f - b < p - r &&
                 f - (b - static_cast<int64_t>(waiting_w[R].size())) < 2 * p - r - 1) {
        order[R].push_back({PassKind::kForward, f, 0});
        f_end[R][static_cast<size_t>(f)] = t + 1;
        ++next_f[R];
      } else if (!waiting_w[R].empty()) {
        order[R].push_back({PassKind::kBackwardWeight, waiting_w[R].front(), 0});
        waiting_w[R].pop_front();
      } else {
        continue;
      }
      busy_until[R] = t + 1;
      ++placed;
    }
  }
  return order;
}

}  // namespace

void check_schedule_shape(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks, const std::string& where) {
  LS_REQUIRE(pp >= 1, where, ": pp (", pp, ") must be >= 1");
  LS_REQUIRE(micro >= 1, where, ": the micro-batches of a step (", micro, ") must be >= 1");
  if (kind == ScheduleKind::kInterleaved) {
    LS_REQUIRE(chunks >= 2, where, ": the interleaved schedule needs virtual_stages >= 2 (got ", chunks,
               "); with one chunk a rank, use 1f1b");
    LS_REQUIRE(micro % pp == 0, where, ": the interleaved schedule needs the micro-batches of a step (", micro,
               ") to be a multiple of pp (", pp, ")");
  } else {
    LS_REQUIRE(chunks == 1, where, ": virtual_stages (", chunks, ") > 1 needs schedule = \"interleaved\"; ",
               schedule_name(kind), " runs one chunk a rank");
  }
}

PipelineSchedule make_schedule(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks, const std::string& where) {
  check_schedule_shape(kind, pp, micro, chunks, where);
  PipelineSchedule s{kind, pp, micro, chunks, {}};
  if (kind == ScheduleKind::kZeroBubble) {
    s.ranks = zero_bubble(pp, micro);
    return s;
  }
  s.ranks.reserve(static_cast<size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    s.ranks.push_back(kind == ScheduleKind::kGpipe ? gpipe(micro) : one_f_one_b(pp, micro, chunks, r));
  }
  return s;
}

Timeline simulate(const PipelineSchedule& s, const PassCosts& costs) {
  return simulate(s, std::vector<PassCosts>(static_cast<size_t>(s.pp), costs));
}

FinalPasses final_passes(const std::vector<Pass>& row, int64_t chunks) {
  FinalPasses f{std::vector<size_t>(static_cast<size_t>(chunks), 0), std::vector<size_t>(static_cast<size_t>(chunks), 0)};
  for (size_t i = 0; i < row.size(); ++i) {
    const auto c = static_cast<size_t>(row[i].chunk);
    if (row[i].kind == PassKind::kBackward || row[i].kind == PassKind::kBackwardInput) f.input.at(c) = i;
    if (row[i].kind == PassKind::kBackward || row[i].kind == PassKind::kBackwardWeight) f.weight.at(c) = i;
  }
  return f;
}

Timeline simulate(const PipelineSchedule& s, const std::vector<PassCosts>& by_rank, TiedEmbedding tied) {
  const int64_t p = s.pp;
  LS_CHECK(static_cast<int64_t>(by_rank.size()) == p, "simulate: ", by_rank.size(), " ranks' costs for pp ", p);
  const bool tied_wait = tied.tied && p > 1;
  const size_t head_done = final_passes(s.ranks.back(), s.chunks).last_weight();
  const size_t embedding_waits = final_passes(s.ranks.front(), s.chunks).last_input();
  std::optional<double> head_sent;  // when the head's gradient of wte reaches the first rank
  // End time of each (kind, stage, micro-batch) placed so far; a full backward counts as Bi too.
  std::map<std::tuple<PassKind, int64_t, int64_t>, double> ended;
  const auto end_of = [&](PassKind k, int64_t stage, int64_t micro) -> const double* {
    const auto it = ended.find({k, stage, micro});
    return it == ended.end() ? nullptr : &it->second;
  };
  Timeline t;
  t.peak_in_flight.assign(static_cast<size_t>(p), 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0);
  std::vector<int64_t> in_flight(static_cast<size_t>(p), 0);
  double busy = 0;
  size_t total = 0;
  for (const auto& r : s.ranks) total += r.size();
  while (t.passes.size() < total) {
    bool progressed = false;
    for (int64_t r = 0; r < p; ++r) {
      const auto R = static_cast<size_t>(r);
      while (next[R] < s.ranks[R].size()) {
        const Pass& pass = s.ranks[R][next[R]];
        const PassCosts& costs = by_rank[R];
        const int64_t stage = s.stage(r, pass.chunk);
        double ready = free_at[R];
        const auto after = [&](PassKind k, int64_t st, bool other_rank) {
          const double* e = end_of(k, st, pass.micro);
          if (e == nullptr) return false;
          ready = std::max(ready, *e + (other_rank ? costs.p2p : 0));
          return true;
        };
        bool inputs = true;
        double cost = 0;
        switch (pass.kind) {
          case PassKind::kForward:
            inputs = stage == 0 || after(PassKind::kForward, stage - 1, s.rank_of(stage - 1) != r);
            cost = costs.forward;
            break;
          case PassKind::kBackward:
          case PassKind::kBackwardInput:
            inputs = after(PassKind::kForward, stage, false) &&
                     (stage == s.stages() - 1 || after(PassKind::kBackwardInput, stage + 1, s.rank_of(stage + 1) != r));
            cost = costs.backward_input + (pass.kind == PassKind::kBackward ? costs.backward_weight : 0);
            break;
          case PassKind::kBackwardWeight:
            inputs = after(PassKind::kBackwardInput, stage, false);
            cost = costs.backward_weight;
            break;
        }
        if (tied_wait && r == 0 && next[R] == embedding_waits) {
          if (!head_sent) break;
          ready = std::max(ready, *head_sent);
        }
        if (!inputs) break;
        const double end = ready + cost;
        if (tied_wait && r == p - 1 && next[R] == head_done) head_sent = end + tied.send;
        ended[{pass.kind == PassKind::kBackward ? PassKind::kBackwardInput : pass.kind, stage, pass.micro}] = end;
        t.passes.push_back({r, pass, ready, end});
        free_at[R] = end;
        busy += cost;
        t.makespan = std::max(t.makespan, end);
        // A micro-batch is in flight from its forward to its input gradient (B or Bi); a W
        // waiting after its Bi keeps only what the weight gradient reads.
        if (pass.kind == PassKind::kForward) {
          t.peak_in_flight[R] = std::max(t.peak_in_flight[R], ++in_flight[R]);
        } else if (pass.kind != PassKind::kBackwardWeight) {
          --in_flight[R];
        }
        ++next[R];
        progressed = true;
      }
    }
    LS_CHECK(progressed, "pipeline schedule ", schedule_name(s.kind), " (pp ", p, ", ", s.micro,
             " micro-batches) cannot complete: every rank waits for a pass that never comes");
  }
  t.bubble = t.makespan > 0 ? 1 - busy / (static_cast<double>(p) * t.makespan) : 0;
  for (const std::vector<Pass>& row : s.ranks) {
    const std::vector<int64_t> peaks = chunk_peaks(row, s.chunks);
    t.chunk_slots.push_back(std::accumulate(peaks.begin(), peaks.end(), int64_t{0}));
  }
  return t;
}

std::vector<int64_t> chunk_peaks(const std::vector<Pass>& row, int64_t chunks) {
  std::vector<int64_t> peak(static_cast<size_t>(chunks), 0), in_flight(peak.size(), 0);
  for (const Pass& pass : row) {
    const auto c = static_cast<size_t>(pass.chunk);
    if (pass.kind == PassKind::kForward) {
      peak[c] = std::max(peak[c], ++in_flight[c]);
    } else if (pass.kind != PassKind::kBackwardInput) {
      --in_flight[c];
    }
  }
  return peak;
}

double bubble_formula(ScheduleKind kind, int64_t pp, int64_t micro, int64_t chunks) {
  const auto p = static_cast<double>(pp), m = static_cast<double>(micro);
  if (kind == ScheduleKind::kZeroBubble) return micro >= pp ? (p - 1) / (3 * m + p - 1) : -1;
  const double v = kind == ScheduleKind::kInterleaved ? static_cast<double>(chunks) : 1;
  return (p - 1) / (v * m + p - 1);
}

}  // namespace lockstep::parallel
