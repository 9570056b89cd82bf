#include "src/plan/layout.hpp"

#include <set>
#include <sstream>

#include "src/core/check.hpp"

namespace lockstep::plan {

std::string Layout::text() const {
  std::string s = str_cat("dp", dp, " tp", tp, " pp", pp, cp > 1 ? str_cat(" cp", cp, ring ? " p2p" : "") : std::string(),
                          ep > 1 ? str_cat(" ep", ep) : std::string(), " mb", micro_batch, " zero", zero);
  if (sp) s += " sp";
  if (pp > 1) {
    s += str_cat(" ", parallel::schedule_name(schedule));
    if (chunks > 1) s += str_cat(":", chunks);
  }
  if (recompute != Recompute::kNone) s += str_cat(" recompute=", recompute_name(recompute));
  return s;
}

Layout parse_layout(const std::string& text, const std::string& where) {
  Layout l;
  std::istringstream in(text);
  std::string token;
  std::set<std::string> seen;
  const auto count = [&](const std::string& t, size_t skip) {
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(t.substr(skip), &used);
      LS_REQUIRE(used == t.size() - skip && v >= 0, "");
    } catch (const std::exception&) {
      throw ConfigError(
          str_cat(where, ": '", t, "' is not a layout item (dpN tpN ppN cpN p2p epN mbN zeroN sp SCHEDULE[:V] recompute=R)"));
    }
    return v;
  };
  while (in >> token) {
    const std::string item = token.substr(0, token.find_first_of("0123456789=:"));
    LS_REQUIRE(seen.insert(item).second, where, ": '", item, "' is given twice in '", text, "'");
    if (token.rfind("dp", 0) == 0) {
      l.dp = count(token, 2);
    } else if (token.rfind("tp", 0) == 0) {
      l.tp = count(token, 2);
    } else if (token.rfind("pp", 0) == 0) {
      l.pp = count(token, 2);
    } else if (token.rfind("cp", 0) == 0) {
      l.cp = count(token, 2);
    } else if (token.rfind("ep", 0) == 0) {
      l.ep = count(token, 2);
    } else if (token.rfind("mb", 0) == 0) {
      l.micro_batch = count(token, 2);
    } else if (token.rfind("zero", 0) == 0) {
      l.zero = static_cast<int>(count(token, 4));
    } else if (token == "sp") {
      l.sp = true;
    } else if (token == "p2p") {
      l.ring = true;
    } else if (token.rfind("recompute=", 0) == 0) {
      l.recompute = parse_recompute(token.substr(10), where + ": recompute");
    } else {
      const size_t colon = token.find(':');
      l.schedule = parallel::parse_schedule_kind(token.substr(0, colon), where + ": schedule");
      if (colon != std::string::npos) l.chunks = count(token, colon + 1);
    }
  }
  LS_REQUIRE(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.cp >= 1 && l.ep >= 1 && l.micro_batch >= 1 && l.chunks >= 1,
             where, ": dp, tp, pp, cp, ep, mb and virtual stages must be >= 1 in '", text, "'");
  return l;
}

}  // namespace lockstep::plan
