// SVG line plots and heat maps (svg_plot.hpp).
#include "verify/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <utility>

#include "src/core/check.hpp"

namespace lockstep::verify {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double x) {
  std::ostringstream os;
  os << std::setprecision(4) << x;
  return os.str();
}

// Colours that stay distinguishable for most colour-blind readers (Okabe-Ito).
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};

// A blue (small) to red (large) ramp for t in [0, 1].
std::string ramp(double t) {
  t = std::clamp(t, 0.0, 1.0);
  const int r = static_cast<int>(std::lround(255 * std::min(1.0, 2 * t)));
  const int b = static_cast<int>(std::lround(255 * std::min(1.0, 2 * (1 - t))));
  const int g = static_cast<int>(std::lround(255 * (1 - std::fabs(2 * t - 1)) * 0.85));
  std::ostringstream os;
  os << "#" << std::hex << std::setfill('0') << std::setw(2) << r << std::setw(2) << g << std::setw(2) << b;
  return os.str();
}

}  // namespace

std::string svg_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<PlotSeries>& series) {
  const double W = 760, H = 440, L = 80, R = 190, T = 40, B = 60;
  double xmin = INFINITY, xmax = -INFINITY, lmin = INFINITY, lmax = -INFINITY;
  for (const auto& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      if (s.y[i] > 0 && std::isfinite(s.y[i])) {
        lmin = std::min(lmin, std::floor(std::log10(s.y[i])));
        lmax = std::max(lmax, std::ceil(std::log10(s.y[i])));
      }
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (xmax == xmin) xmax = xmin + 1;
  if (!std::isfinite(lmin)) lmin = -8, lmax = 0;
  if (lmax == lmin) lmax = lmin + 1;
  const double floor_y = H - B;  // where "0" (bitwise equal) and the axis sit
  auto px = [&](double x) { return L + (x - xmin) / (xmax - xmin) * (W - L - R); };
  auto py = [&](double y) {
    if (!(y > 0)) return floor_y;
    if (!std::isfinite(y)) return T;
    return T + 14 + (lmax - std::log10(y)) / (lmax - lmin) * (H - B - T - 28);
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << esc(title) << "</text>\n";
  o << "<line x1=\"" << L << "\" y1=\"" << floor_y << "\" x2=\"" << W - R << "\" y2=\"" << floor_y
    << "\" stroke=\"black\"/>\n<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << floor_y
    << "\" stroke=\"black\"/>\n";
  for (double e = lmin; e <= lmax; e += 1) {
    o << "<line x1=\"" << L << "\" y1=\"" << py(std::pow(10, e)) << "\" x2=\"" << W - R << "\" y2=\""
      << py(std::pow(10, e)) << "\" stroke=\"#ddd\"/><text x=\"" << L - 6 << "\" y=\"" << py(std::pow(10, e)) + 4
      << "\" text-anchor=\"end\">1e" << e << "</text>\n";
  }
  o << "<text x=\"" << L - 6 << "\" y=\"" << floor_y + 4 << "\" text-anchor=\"end\">0</text>\n";
  const int xticks = static_cast<int>(std::min(10.0, xmax - xmin));
  for (int i = 0; i <= xticks; ++i) {
    const double x = xmin + (xmax - xmin) * i / std::max(1, xticks);
    o << "<text x=\"" << px(x) << "\" y=\"" << floor_y + 18 << "\" text-anchor=\"middle\">" << num(std::round(x))
      << "</text>\n";
  }
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">" << esc(x_label)
    << "</text>\n<text transform=\"translate(18," << (T + floor_y) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << esc(y_label) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* c = kColours[k % std::size(kColours)];
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i) pts += num(px(s.x[i])) + "," + num(py(s.y[i])) + " ";
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\" points=\"" << pts << "\"/>\n";
    for (size_t i = 0; i < s.x.size(); ++i) {
      o << "<circle cx=\"" << px(s.x[i]) << "\" cy=\"" << py(s.y[i]) << "\" r=\"2.5\" fill=\"" << c << "\"><title>"
        << esc(s.name) << " step " << num(s.x[i]) << ": " << num(s.y[i]) << "</title></circle>\n";
    }
    o << "<rect x=\"" << W - R + 14 << "\" y=\"" << T + 16 * k << "\" width=\"12\" height=\"3\" fill=\"" << c
      << "\"/><text x=\"" << W - R + 32 << "\" y=\"" << T + 16 * k + 5 << "\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string svg_heat_map(const std::string& title, const std::vector<std::string>& rows,
                         const std::vector<std::string>& cols, const std::vector<std::vector<double>>& values,
                         const std::string& value_label) {
  const double cw = 34, ch = 22, L = 150, T = 50, top_labels = 130;
  double lmin = INFINITY, lmax = -INFINITY;
  for (const auto& r : values) {
    for (double v : r) {
      if (v > 0 && std::isfinite(v)) lmin = std::min(lmin, std::log10(v)), lmax = std::max(lmax, std::log10(v));
    }
  }
  if (!std::isfinite(lmin)) lmin = -8, lmax = 0;
  if (lmax - lmin < 1) lmin = lmax - 1;
  const double W = L + cw * static_cast<double>(cols.size()) + 140;
  const double H = T + top_labels + std::max(ch * static_cast<double>(rows.size()), 220.0) + 40;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"10\" y=\"22\" font-size=\"15\">" << esc(title) << "</text>\n";
  const double y0 = T + top_labels;
  for (size_t j = 0; j < cols.size(); ++j) {
    const double x = L + cw * static_cast<double>(j) + cw / 2;
    o << "<text transform=\"translate(" << x << "," << y0 - 6 << ") rotate(-60)\">" << esc(cols[j]) << "</text>\n";
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = y0 + ch * static_cast<double>(i);
    o << "<text x=\"" << L - 6 << "\" y=\"" << y + ch / 2 + 4 << "\" text-anchor=\"end\">" << esc(rows[i]) << "</text>\n";
    for (size_t j = 0; j < cols.size(); ++j) {
      const double v = values[i][j];
      std::string fill = std::isnan(v) ? "#bbbbbb" : v <= 0 ? "#ffffff" : ramp((std::log10(v) - lmin) / (lmax - lmin));
      if (std::isinf(v)) fill = ramp(1);
      o << "<rect x=\"" << L + cw * static_cast<double>(j) << "\" y=\"" << y << "\" width=\"" << cw << "\" height=\""
        << ch << "\" fill=\"" << fill << "\" stroke=\"#888\" stroke-width=\"0.5\"><title>" << esc(rows[i]) << " "
        << esc(cols[j]) << ": " << (std::isnan(v) ? std::string("absent") : v == 0 ? std::string("bitwise equal") : num(v))
        << "</title></rect>\n";
    }
  }
  // Colour bar.
  const double bx = L + cw * static_cast<double>(cols.size()) + 30;
  for (int k = 0; k < 50; ++k) {
    o << "<rect x=\"" << bx << "\" y=\"" << y0 + 160 - 3.2 * (k + 1) << "\" width=\"14\" height=\"3.3\" fill=\""
      << ramp(k / 49.0) << "\"/>\n";
  }
  o << "<text x=\"" << bx + 18 << "\" y=\"" << y0 + 4 << "\">1e" << num(lmax) << "</text><text x=\"" << bx + 18
    << "\" y=\"" << y0 + 160 << "\">1e" << num(lmin) << "</text>\n<text x=\"" << bx << "\" y=\"" << y0 + 178
    << "\">" << esc(value_label) << "</text>\n<rect x=\"" << bx << "\" y=\"" << y0 + 188
    << "\" width=\"14\" height=\"10\" fill=\"white\" stroke=\"#888\"/><text x=\"" << bx + 18 << "\" y=\"" << y0 + 197
    << "\">equal</text>\n<rect x=\"" << bx << "\" y=\"" << y0 + 204 << "\" width=\"14\" height=\"10\" fill=\"#bbbbbb\"/>"
    << "<text x=\"" << bx + 18 << "\" y=\"" << y0 + 213 << "\">absent</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::string svg_timeline(const std::string& title, const std::vector<std::string>& rows,
                         const std::vector<std::string>& series_names, const std::vector<TimelineBar>& bars,
                         const std::string& time_label) {
  double span = 0;
  for (const TimelineBar& b : bars) span = std::max(span, b.end);
  if (span <= 0) span = 1;
  // The left margin holds the row labels (about 6 pixels a character at this font size).
  size_t longest = 0;
  for (const std::string& r : rows) longest = std::max(longest, r.size());
  const double L = std::max(80.0, 6.0 * static_cast<double>(longest) + 16), R = 20, T = 40, row_h = 28, legend = 30;
  const double W = std::clamp(24.0 * span, 600.0, 2400.0) + L + R;
  const double H = T + row_h * static_cast<double>(rows.size()) + 40 + legend;
  const double scale = (W - L - R) / span;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(W) << "\" height=\"" << num(H)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << num(L) << "\" y=\"22\" font-size=\"14\">" << esc(title) << "</text>\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = T + row_h * static_cast<double>(r);
    o << "<text x=\"" << num(L - 8) << "\" y=\"" << num(y + row_h / 2 + 4) << "\" text-anchor=\"end\">"
      << esc(rows[r]) << "</text>\n"
      << "<rect x=\"" << num(L) << "\" y=\"" << num(y + 2) << "\" width=\"" << num(W - L - R) << "\" height=\""
      << num(row_h - 4) << "\" fill=\"#f2f2f2\"/>\n";
  }
  for (const TimelineBar& b : bars) {
    const double x = L + b.start * scale, w = (b.end - b.start) * scale;
    const double y = T + row_h * static_cast<double>(b.row);
    o << "<rect x=\"" << num(x) << "\" y=\"" << num(y + 2) << "\" width=\"" << num(w) << "\" height=\""
      << num(row_h - 4) << "\" fill=\"" << kColours[b.series % std::size(kColours)]
      << "\" stroke=\"white\"><title>" << esc(b.label) << "</title></rect>\n";
    if (w >= 14) {
      o << "<text x=\"" << num(x + w / 2) << "\" y=\"" << num(y + row_h / 2 + 4)
        << "\" text-anchor=\"middle\" fill=\"white\">" << esc(b.label) << "</text>\n";
    }
  }
  const double axis_y = T + row_h * static_cast<double>(rows.size()) + 16;
  o << "<text x=\"" << num(L) << "\" y=\"" << num(axis_y) << "\">0</text>\n"
    << "<text x=\"" << num(W - R) << "\" y=\"" << num(axis_y) << "\" text-anchor=\"end\">" << num(span) << "</text>\n"
    << "<text x=\"" << num((L + W - R) / 2) << "\" y=\"" << num(axis_y) << "\" text-anchor=\"middle\">"
    << esc(time_label) << "</text>\n";
  double lx = L;
  for (size_t i = 0; i < series_names.size(); ++i) {
    o << "<rect x=\"" << num(lx) << "\" y=\"" << num(axis_y + 12) << "\" width=\"12\" height=\"12\" fill=\""
      << kColours[i % std::size(kColours)] << "\"/>\n"
      << "<text x=\"" << num(lx + 16) << "\" y=\"" << num(axis_y + 22) << "\">" << esc(series_names[i]) << "</text>\n";
    lx += 40 + 7.0 * static_cast<double>(series_names[i].size());
  }
  o << "</svg>\n";
  return o.str();
}

namespace {

// The width and height a plot's opening <svg> tag declares.
std::pair<double, double> svg_size(const std::string& svg) {
  const auto attribute = [&](const std::string& name) {
    const size_t at = svg.find(name + "=\"");
    LS_CHECK(at != std::string::npos, "an SVG without ", name);
    return std::stod(svg.substr(at + name.size() + 2));
  };
  return {attribute("width"), attribute("height")};
}

}  // namespace

std::string svg_stack(const std::vector<std::string>& plots) {
  double width = 0, height = 0;
  std::ostringstream body;
  for (const std::string& p : plots) {
    const auto [w, h] = svg_size(p);
    // A nested <svg> keeps each plot's own coordinates; only its position changes.
    body << "<svg y=\"" << height << "\"" << p.substr(4);
    width = std::max(width, w);
    height += h;
  }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\">\n"
    << body.str() << "</svg>\n";
  return o.str();
}

}  // namespace lockstep::verify
