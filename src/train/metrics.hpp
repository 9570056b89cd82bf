// What a training run reports: the per-step console line, JSONL metrics, peak memory, and the
// fp32 GEMM peak that MFU is measured against.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

// Peak resident memory of this process in MiB (VmHWM), 0 where /proc is unavailable.
double peak_memory_mib();

// Achieved GFLOP/s of OpenBLAS sgemm on a square 1024 problem with the current thread count:
// the peak MFU is reported against (measured, since nominal peaks are not what a CPU sustains).
double measure_sgemm_peak_gflops();

// Appends one JSON object per line; flushed per record so that a killed run keeps its metrics.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: continue an existing file (a resumed run) instead of truncating it.
  MetricsWriter(const std::string& path, bool append);
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace lockstep
