// Two kinds of plot as standalone SVG text that any browser opens: lines over a log-scale y axis,
// and a heat map with a log-scale colour bar. Written directly (no plotting library, no Python), for
// `lockstep diff --plot`.
// Not here: what is plotted (verify/diff_plot.cpp).
#pragma once

#include <string>
#include <vector>

namespace lockstep::verify {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // y <= 0 is drawn on the bottom edge as "0" (bitwise equal)
};

// Lines with markers; y on a log10 axis spanning the positive values.
std::string svg_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                          const std::vector<PlotSeries>& series);

// values[row][col]: > 0 coloured on a log10 scale, 0 drawn as "equal" (white), NaN as "absent" (grey).
std::string svg_heat_map(const std::string& title, const std::vector<std::string>& rows,
                         const std::vector<std::string>& cols, const std::vector<std::vector<double>>& values,
                         const std::string& value_label);

}  // namespace lockstep::verify
