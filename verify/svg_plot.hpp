// Plots as standalone SVG text that any browser opens: lines over a log-scale y axis, a heat map
// with a log-scale colour bar, a timeline (bars on rows), and a stack of them. Written directly
// (no plotting library, no Python), for `lockstep diff --plot`, `lockstep schedule --svg` and
// `lockstep fp8 report`.
// Not here: what is plotted (verify/diff_plot.cpp, src/cli/cmd_schedule.cpp, verify/fp8_report.cpp).
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

// A bar of a timeline: [start, end) on row `row`, labelled, in colour `series` (an index into the
// palette, named in the legend by series_names).
struct TimelineBar {
  size_t row;
  double start, end;
  std::string label;
  size_t series;
};

// Rows top to bottom, time to the right; idle time is left blank.
std::string svg_timeline(const std::string& title, const std::vector<std::string>& rows,
                         const std::vector<std::string>& series_names, const std::vector<TimelineBar>& bars,
                         const std::string& time_label);

// Plots of the functions above, one below the other, in one SVG.
std::string svg_stack(const std::vector<std::string>& plots);

}  // namespace lockstep::verify
