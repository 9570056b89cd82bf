#include "verify/report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "src/optim/grad_clip.hpp"

namespace lockstep::verify {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string ulp_str(uint64_t u) {
  return u == std::numeric_limits<uint64_t>::max() ? "nan" : std::to_string(u);
}

// Bitwise rows: larger ulp distance is worse; bound rows: larger tightness is worse.
double badness(const TensorRow& row) {
  if (row.check == CheckKind::kBound) return row.cmp.max_tightness;
  return static_cast<double>(row.cmp.max_ulp);
}

}  // namespace

bool StepReport::ok() const {
  return std::all_of(rows.begin(), rows.end(), [](const TensorRow& r) { return r.cmp.ok(); });
}

const TensorRow* StepReport::worst() const {
  const TensorRow* w = nullptr;
  for (const auto& r : rows) {
    if (w == nullptr) {
      w = &r;
      continue;
    }
    if (!r.cmp.ok() && w->cmp.ok()) {
      w = &r;
    } else if (r.cmp.ok() == w->cmp.ok() && badness(r) > badness(*w)) {
      w = &r;
    }
  }
  return w;
}

bool StepReport::clipped() const { return clip_scale(grad_norm, grad_clip).has_value(); }

double StepReport::worst_tightness() const {
  double t = 0;
  for (const auto& r : rows) {
    if (r.check == CheckKind::kBound) t = std::max(t, r.cmp.max_tightness);
  }
  return t;
}

void print_report(const StepReport& r, std::ostream& out) {
  size_t width = 6;
  for (const auto& row : r.rows) width = std::max(width, row.name.size());
  const auto flags = out.flags();
  out << "verify step " << r.step << ": trainer mode " << r.mode << " vs reference " << r.reference
      << "\n";
  out << std::left << std::setw(static_cast<int>(width)) << "tensor" << std::right
      << std::setw(16) << "shape" << std::setw(9) << "check" << std::setw(13) << "max |err|"
      << std::setw(13) << "max bound" << std::setw(12) << "tightness" << std::setw(11)
      << "max ulp" << "  verdict\n";
  for (const auto& row : r.rows) {
    const bool bound = row.check == CheckKind::kBound;
    out << std::left << std::setw(static_cast<int>(width)) << row.name << std::right
        << std::setw(16) << shape_str(row.shape) << std::setw(9) << (bound ? "bound" : "bitwise")
        << std::scientific << std::setprecision(3) << std::setw(13) << row.cmp.max_abs_err
        << std::setw(13) << row.cmp.max_bound << std::setw(12);
    if (bound) {
      out << row.cmp.max_tightness;
    } else {
      out << "-";
    }
    out << std::setw(11) << ulp_str(row.cmp.max_ulp) << "  "
        << (row.cmp.ok() ? "ok" : "VIOLATION (" + std::to_string(row.cmp.mismatches) + "/" +
                                      std::to_string(row.cmp.count) + ")")
        << "\n";
    for (const auto& m : row.cmp.first) {
      out << "    [" << m.index << "] trainer " << std::setprecision(9) << m.got << " reference "
          << m.want;
      if (bound) out << " bound " << m.bound;
      out << "\n";
    }
  }
  out.flags(flags);
  const TensorRow* w = r.worst();
  int64_t violations = 0;
  for (const auto& row : r.rows) violations += row.cmp.ok() ? 0 : 1;
  std::ostringstream s;
  s << "verify step: " << (r.ok() ? "PASS" : "FAIL") << ", " << r.rows.size() << " tensors, "
    << violations << " with violations";
  if (w != nullptr) {
    s << "; worst tensor " << w->name;
    if (w->check == CheckKind::kBound) {
      s << " (tightness " << std::setprecision(3) << w->cmp.max_tightness << ", max ulp "
        << ulp_str(w->cmp.max_ulp) << ")";
    } else {
      s << " (max ulp " << ulp_str(w->cmp.max_ulp) << ")";
    }
  }
  s << std::fixed << std::setprecision(2) << "; trainer step " << r.trainer_seconds
    << " s, reference " << r.reference_seconds << " s";
  std::ostringstream clip;
  clip << "gradient norm " << std::setprecision(6) << r.grad_norm;
  if (r.grad_clip > 0)
    clip << (r.clipped() ? " above" : " not above") << " grad_clip " << r.grad_clip << ": "
         << (r.clipped() ? "clipped" : "not clipped");
  else
    clip << ", grad_clip 0: clipping off";
  out << clip.str() << "\n" << s.str() << "\n";
}

nlohmann::json report_json(const StepReport& r) {
  auto num = [](double x) -> nlohmann::json {
    if (std::isfinite(x)) return x;
    return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json first = nlohmann::json::array();
    for (const auto& m : row.cmp.first) {
      first.push_back({{"index", m.index}, {"trainer", num(m.got)}, {"reference", num(m.want)},
                       {"bound", num(m.bound)}});
    }
    rows.push_back({{"name", row.name},
                    {"shape", row.shape},
                    {"check", row.check == CheckKind::kBound ? "bound" : "bitwise"},
                    {"count", row.cmp.count},
                    {"violations", row.cmp.mismatches},
                    {"max_abs_err", num(row.cmp.max_abs_err)},
                    {"max_bound", num(row.cmp.max_bound)},
                    {"tightness", num(row.cmp.max_tightness)},
                    {"max_ulp", row.cmp.max_ulp == std::numeric_limits<uint64_t>::max()
                                    ? nlohmann::json("nan")
                                    : nlohmann::json(row.cmp.max_ulp)},
                    {"ok", row.cmp.ok()},
                    {"first_violations", first}});
  }
  const TensorRow* w = r.worst();
  return {{"step", r.step},
          {"mode", r.mode},
          {"reference", r.reference},
          {"ok", r.ok()},
          {"worst_tensor", w ? w->name : ""},
          {"worst_tightness", num(r.worst_tightness())},
          {"trainer_seconds", r.trainer_seconds},
          {"reference_seconds", r.reference_seconds},
          {"grad_norm", num(r.grad_norm)},
          {"grad_clip", r.grad_clip},
          {"clipped", r.clipped()},
          {"rows", rows}};
}

}  // namespace lockstep::verify
