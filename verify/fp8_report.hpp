// `lockstep fp8 report`: what a run's fp8 statistics and sentinel checks say, from its metrics
// JSONL (src/train/fp8_statistics.hpp's "fp8" records, verify/detect/fp8_sentinel.hpp's
// "fp8_sentinel" records and fp8 findings): which layers' quantization hurts most (the GEMMs by
// mean relative error over the checks, with their largest error / bound), the GEMMs whose error
// reached their bf16 product at some check (their result mostly quantization noise: within its
// bound, but a layer that may not learn in fp8 where it would in bf16), each tensor's worst step
// (error / bound, saturated and underflowed fractions), the findings; and an SVG of the
// worst tensors' error / bound, saturation and amax over the steps and the worst GEMMs' relative
// error at the checks.
// Not here: the statistics (src/train/fp8_statistics.hpp), the checks (verify/detect/fp8_sentinel.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace lockstep::verify {

struct Fp8Series {
  std::vector<double> step, value;
};

struct Fp8Report {
  int64_t steps = 0, checks = 0;
  // Per tensor ("LINEAR/ROLE"): error_ratio, saturated, underflow, amax over the steps.
  std::map<std::string, std::map<std::string, Fp8Series>> tensors;
  // Per GEMM ("LINEAR/GEMM"): ratio, worst_ratio, rel_error over the checks.
  std::map<std::string, std::map<std::string, Fp8Series>> gemms;
  std::vector<std::string> findings;  // their lines
};

// Throws DataError naming the file and line of a malformed record, and when the file holds no fp8
// record.
Fp8Report read_fp8_report(const std::string& metrics_path);
// The text report; `top`: rows per ranking.
void print_fp8_report(const Fp8Report& r, size_t top, std::ostream& out);
// The SVG (four stacked plots of the `top` worst tensors and GEMMs).
std::string fp8_report_svg(const Fp8Report& r, size_t top);

}  // namespace lockstep::verify
