// SVG writers (verify/svg_plot.hpp): the marks are where the scales put them, special values are
// drawn as documented, and text is escaped.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>

#include "verify/svg_plot.hpp"

namespace lockstep::verify {
namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The cy of the marker whose tooltip is `title`.
double marker_y(const std::string& svg, const std::string& title) {
  const std::regex re("cy=\"([0-9.e+-]+)\"[^>]*><title>" + title + "</title>");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(svg, m, re)) << title;
  return std::stod(m[1].str());
}

TEST(SvgPlot, LogAxisOrdersMarkersAndPutsZeroOnTheFloor) {
  const std::string svg = svg_line_plot("t <&>", "step", "err",
                                        {{"s", {0, 1, 2, 3}, {0, 1e-6, 1e-3, 1}}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("t &lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1);
  const double y0 = marker_y(svg, "s step 0: 0"), y1 = marker_y(svg, "s step 1: 1e-06"),
               y2 = marker_y(svg, "s step 2: 0.001"), y3 = marker_y(svg, "s step 3: 1");
  EXPECT_GT(y0, y1);  // SVG y grows downwards: "0" lowest, then 1e-6, 1e-3, 1
  EXPECT_GT(y1, y2);
  EXPECT_GT(y2, y3);
  EXPECT_NEAR((y1 - y2) / (y2 - y3), 1.0, 1e-9);  // equal decades, equal distances
}

TEST(SvgPlot, HeatMapCellsEqualAbsentAndColoured) {
  const std::string svg = svg_heat_map("h", {"layer 0", "layer 1"}, {"a", "b"}, {{0, NAN}, {1e-7, 1e-2}}, "rel");
  EXPECT_NE(svg.find("fill=\"#ffffff\" stroke=\"#888\" stroke-width=\"0.5\"><title>layer 0 a: bitwise equal"),
            std::string::npos);
  EXPECT_NE(svg.find("fill=\"#bbbbbb\" stroke=\"#888\" stroke-width=\"0.5\"><title>layer 0 b: absent"),
            std::string::npos);
  // The smallest value is the blue end of the ramp, the largest the red end.
  EXPECT_NE(svg.find("fill=\"#0000ff\" stroke=\"#888\" stroke-width=\"0.5\"><title>layer 1 a: 1e-07"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#ff0000\" stroke=\"#888\" stroke-width=\"0.5\"><title>layer 1 b: 0.01"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::verify
