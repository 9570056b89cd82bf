// `lockstep diff`: elementwise comparison of two dumps (diff.hpp), as a table and as JSON.
#include "verify/diff.hpp"

#include <charconv>
#include <cmath>
#include <iomanip>
#include <map>

#include "verify/core/compare.hpp"
#include "verify/op_bounds.hpp"

namespace lockstep::verify {

DiffMode DiffMode::parse(const std::string& text, const std::string& what) {
  if (text == "exact") return {};
  if (text.rfind("ulp:", 0) == 0) {
    uint64_t n = 0;
    const char* first = text.data() + 4;
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(first, last, n);
    if (ec == std::errc() && end == last && first != last) return {n};
  }
  throw ConfigError(str_cat(what, ": expected \"exact\" or \"ulp:N\" (N >= 0 ulps), got \"", text, "\""));
}

std::string DiffMode::name() const { return max_ulp == 0 ? "exact" : "ulp:" + std::to_string(max_ulp); }

TensorDiff diff_arrays(const float* a, const float* b, int64_t n, DiffMode mode) {
  TensorDiff d;
  d.count = n;
  d.bitwise_equal = true;
  for (int64_t i = 0; i < n; ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    const bool same_bits = float_bits(a[i]) == float_bits(b[i]) || both_nan;
    if (same_bits) continue;
    d.bitwise_equal = false;
    const uint64_t ulp = ulp_distance(a[i], b[i]);
    const double err = std::fabs(double(a[i]) - double(b[i]));
    const double scale = std::max(std::fabs(double(a[i])), std::fabs(double(b[i])));
    d.max_ulp = std::max(d.max_ulp, ulp);
    if (std::isnan(err) || err > d.max_abs_err) d.max_abs_err = std::isnan(err) ? INFINITY : err;
    if (scale > 0) d.max_rel_err = std::max(d.max_rel_err, std::isnan(err) ? INFINITY : err / scale);
    // Exact mode: any differing bits (+0 vs -0 included). ulp:N: more than N ulps apart.
    const bool bad = mode.max_ulp == 0 ? true : ulp > mode.max_ulp;
    if (bad) {
      if (d.mismatches == 0) d.first_index = i, d.first_a = a[i], d.first_b = b[i];
      ++d.mismatches;
    }
  }
  return d;
}

namespace {

// Re-judges d (a bitwise/ulp comparison of a and b) against both sides' op-local bounds.
void judge_within_bounds(const float* a, const float* b, int64_t n, const OpLocalBound& ra, const OpLocalBound& rb,
                         TensorDiff& d) {
  d.bounded = true;
  d.mismatches = 0;
  d.first_index = -1;
  auto outside = [](float x, double y, double bound, double& tight) {
    if (!std::isfinite(x) || !std::isfinite(y)) return !((std::isnan(x) && std::isnan(y)) || double(x) == y);
    const double err = std::fabs(double(x) - y);
    if (err > 0) tight = std::max(tight, bound > 0 ? err / bound : INFINITY);
    return !(err <= bound);
  };
  for (int64_t i = 0; i < n; ++i) {
    const bool out_a = outside(a[i], ra.value[i], ra.bound[i], d.tight_a);
    const bool out_b = outside(b[i], rb.value[i], rb.bound[i], d.tight_b);
    const double combined = ra.bound[i] + rb.bound[i] + std::fabs(ra.value[i] - rb.value[i]);
    d.max_bound = std::max(d.max_bound, combined);
    const double diff = std::fabs(double(a[i]) - double(b[i]));
    if (diff > 0) d.tight_diff = std::max(d.tight_diff, combined > 0 ? diff / combined : INFINITY);
    d.outside_a += out_a ? 1 : 0;
    d.outside_b += out_b ? 1 : 0;
    if (out_a || out_b) {
      if (d.mismatches == 0) d.first_index = i, d.first_a = a[i], d.first_b = b[i];
      ++d.mismatches;
    }
  }
}

}  // namespace

DiffReport diff_dumps(const std::string& dir_a, const std::string& dir_b, DiffMode mode, const BoundsInputs* bounds) {
  const Dump a = read_dump(dir_a), b = read_dump(dir_b);
  DiffReport r;
  r.dir_a = dir_a;
  r.dir_b = dir_b;
  r.mode = mode;
  r.bounds = bounds != nullptr;
  // Op-local references per dumped step and side.
  std::map<int64_t, std::map<std::string, OpLocalBound>> ref_a, ref_b;
  if (bounds) {
    for (const auto& e : a.entries) {
      if (ref_a.count(e.step)) continue;
      ref_a[e.step] = op_local_bounds(a, e.step, bounds->ckpt_a);
      ref_b[e.step] = op_local_bounds(b, e.step, bounds->ckpt_b);
    }
  }
  std::map<std::string, const DumpEntry*> in_b;
  for (const auto& e : b.entries) in_b[e.name] = &e;
  std::map<std::string, bool> seen;
  for (const auto& ea : a.entries) {
    seen[ea.name] = true;
    const auto it = in_b.find(ea.name);
    if (it == in_b.end()) {
      r.only_a.push_back(ea.name);
      continue;
    }
    const DumpEntry& eb = *it->second;
    const std::vector<float> da = load_entry(a, ea), db = load_entry(b, eb);
    TensorDiff d;
    if (ea.shape == eb.shape) {
      const auto n = static_cast<int64_t>(da.size());
      d = diff_arrays(da.data(), db.data(), n, mode);
      if (bounds) {
        const std::string key = ea.name.substr(ea.name.find('/', 5) + 1);  // after step/N/
        const auto ia = ref_a[ea.step].find(key), ib = ref_b[ea.step].find(key);
        if (ia != ref_a[ea.step].end() && ib != ref_b[ea.step].end() &&
            static_cast<int64_t>(ia->second.value.size()) == n && static_cast<int64_t>(ib->second.value.size()) == n) {
          judge_within_bounds(da.data(), db.data(), n, ia->second, ib->second, d);
        }
      }
    } else {
      d.count = static_cast<int64_t>(std::max(da.size(), db.size()));
      d.mismatches = d.count;
    }
    d.name = ea.name;
    d.step = ea.step;
    d.shape_a = ea.shape;
    d.shape_b = eb.shape;
    if (!d.ok() && !r.first_divergent) r.first_divergent = r.tensors.size();
    r.tensors.push_back(std::move(d));
  }
  for (const auto& eb : b.entries) {
    if (!seen.count(eb.name)) r.only_b.push_back(eb.name);
  }
  return r;
}

namespace {

// The C-order multi-index of flat index i in `shape`.
std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] > 0 ? i % shape[k] : 0;
    i = shape[k] > 0 ? i / shape[k] : 0;
  }
  return idx;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) t += ',';
    t += std::to_string(s[i]);
  }
  return t + ")";
}

std::string ulp_text(uint64_t u) { return u == UINT64_MAX ? "nan" : std::to_string(u); }

std::string first_text(const TensorDiff& d) {
  if (d.shape_a != d.shape_b) return "shapes " + shape_text(d.shape_a) + " vs " + shape_text(d.shape_b);
  std::ostringstream os;
  os << std::setprecision(9) << nlohmann::json(unravel(d.first_index, d.shape_a)).dump() << " "
     << d.first_a << " vs " << d.first_b;
  return os.str();
}

}  // namespace

nlohmann::json DiffReport::to_json() const {
  nlohmann::json t = nlohmann::json::array();
  for (const auto& d : tensors) {
    nlohmann::json j = {{"name", d.name},
                        {"step", d.step},
                        {"shape_a", d.shape_a},
                        {"shape_b", d.shape_b},
                        {"bitwise_equal", d.bitwise_equal},
                        {"ok", d.ok()},
                        {"count", d.count},
                        {"mismatches", d.mismatches},
                        {"fraction", d.fraction()},
                        {"max_abs_err", std::isfinite(d.max_abs_err) ? nlohmann::json(d.max_abs_err) : "inf"},
                        {"max_rel_err", std::isfinite(d.max_rel_err) ? nlohmann::json(d.max_rel_err) : "inf"},
                        {"max_ulp", d.max_ulp == UINT64_MAX ? nlohmann::json("nan") : nlohmann::json(d.max_ulp)}};
    if (d.bounded) {
      auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json("inf"); };
      j["bounds"] = {{"outside_a", d.outside_a}, {"outside_b", d.outside_b}, {"tightness_a", num(d.tight_a)},
                     {"tightness_b", num(d.tight_b)}, {"tightness_diff", num(d.tight_diff)},
                     {"max_bound", num(d.max_bound)}};
    }
    if (d.first_index >= 0) {
      j["first_mismatch"] = {{"flat_index", d.first_index},
                             {"index", unravel(d.first_index, d.shape_a)},
                             {"a", d.first_a},
                             {"b", d.first_b}};
    }
    t.push_back(std::move(j));
  }
  return {{"a", dir_a},
          {"b", dir_b},
          {"mode", bounds ? "bounds (op-local)" : mode.name()},
          {"agree", agree()},
          {"first_divergent", first_divergent ? nlohmann::json(tensors[*first_divergent].name) : nlohmann::json()},
          {"compared", tensors.size()},
          {"tensors", t},
          {"only_in_a", only_a},
          {"only_in_b", only_b}};
}

void DiffReport::print(std::ostream& os) const {
  os << "diff " << dir_a << " " << dir_b << " (mode " << (bounds ? "bounds" : mode.name()) << "): ";
  if (tensors.empty()) {
    os << "no tensors in common\n";
  } else if (first_divergent) {
    const TensorDiff& d = tensors[*first_divergent];
    int64_t bad = 0;
    for (const auto& t : tensors) bad += t.ok() ? 0 : 1;
    os << "DIVERGE; first divergent tensor " << d.name << " (" << d.mismatches << "/" << d.count
       << " elements, first " << first_text(d) << "); " << bad << " of " << tensors.size()
       << " tensors differ\n";
  } else {
    os << "agree (" << tensors.size() << " tensors)\n";
  }
  size_t w = 6;
  for (const auto& d : tensors) w = std::max(w, d.name.size());
  os << std::left << std::setw(static_cast<int>(w)) << "tensor" << std::right << "  bits  " << std::setw(12)
     << "mismatch" << std::setw(10) << "fraction" << std::setw(12) << "max|err|" << std::setw(12) << "max rel"
     << std::setw(12) << "max ulp";
  if (bounds) os << std::setw(10) << "A/bound" << std::setw(10) << "B/bound" << std::setw(10) << "diff/bnd";
  os << "  first mismatch\n";
  for (const auto& d : tensors) {
    os << std::left << std::setw(static_cast<int>(w)) << d.name << std::right << "  "
       << (d.bitwise_equal ? "same" : "diff") << "  " << std::setw(12) << d.mismatches << std::setw(10)
       << std::setprecision(4) << d.fraction() << std::setw(12) << std::setprecision(3) << d.max_abs_err
       << std::setw(12) << d.max_rel_err << std::setw(12) << ulp_text(d.max_ulp);
    if (bounds && d.bounded) {
      os << std::setprecision(2) << std::setw(10) << d.tight_a << std::setw(10) << d.tight_b << std::setw(10)
         << d.tight_diff;
    } else if (bounds) {
      os << std::setw(30) << "(no bound: bitwise)";
    }
    os << "  " << (d.ok() ? "" : first_text(d)) << "\n";
  }
  if (bounds) {
    os << "bounds are op-local: each side's tensor against the exact op on that side's own dumped inputs "
          "(Bounded<double> reference from the side's checkpoint, any fp32 summation order); diff/bnd is |A-B| "
          "over boundA + boundB + |exactA - exactB|\n";
  }
  for (const auto& n : only_a) os << "only in " << dir_a << ": " << n << "\n";
  for (const auto& n : only_b) os << "only in " << dir_b << ": " << n << "\n";
}

}  // namespace lockstep::verify
