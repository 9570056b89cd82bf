// `lockstep diff --plot DIR`: a diff report as two SVG pictures a person can open.
//   error_vs_step.svg  the largest relative error |a − b| / max(|a|, |b|) per dumped step, one line
//                      per tensor group (activations, activation gradients, loss, parameter
//                      gradients, parameters); bitwise equal steps sit on the "0" line;
//   layer_heatmap.svg  rows = layers (and a row for the tensors outside them), columns = tensor
//                      kinds in execution order (ln1/out, attn/qkv, ..., grad/..., param/...), the
//                      largest relative error at the first divergent step (the last step when the
//                      dumps agree); white = bitwise equal, grey = not dumped.
// Not here: SVG drawing (svg_plot.hpp), the comparison (diff.hpp).
#pragma once

#include <string>
#include <vector>

#include "verify/diff.hpp"

namespace lockstep::verify {

// Writes both files into `dir` (created if absent); returns their paths.
std::vector<std::string> write_diff_plots(const DiffReport& report, const std::string& dir);

}  // namespace lockstep::verify
