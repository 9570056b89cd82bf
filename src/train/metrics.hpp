// What a training run writes down: JSONL metrics and the process's peak memory. (The fp32 GEMM peak
// MFU is measured against is the backend's: kernels/cpu/gemm_peak.hpp.)
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

// Peak resident memory of this process in MiB (VmHWM), 0 where /proc is unavailable.
double peak_memory_mib();
// Resident memory of this process now in MiB (VmRSS), 0 where /proc is unavailable.
double resident_memory_mib();
// Restarts the peak from the resident memory now (Linux: "5" to /proc/self/clear_refs), so that
// what a start-up step allocated and freed does not count as the run's peak; where the kernel does
// not allow it the peak stays the process's.
void restart_peak_memory();

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
