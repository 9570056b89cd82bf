#include "src/train/metrics.hpp"

#include <filesystem>

#include "src/core/check.hpp"

namespace lockstep {

namespace {

// A "Name:   N kB" line of /proc/self/status, in MiB.
double status_mib(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name, 0) == 0) return std::stod(line.substr(name.size())) / 1024.0;
  }
  return 0.0;
}

}  // namespace

double peak_memory_mib() { return status_mib("VmHWM:"); }

double resident_memory_mib() { return status_mib("VmRSS:"); }

void restart_peak_memory() { std::ofstream("/proc/self/clear_refs") << "5"; }

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  LS_REQUIRE(out_.is_open(), "[log] metrics: cannot open '", path, "' for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  LS_REQUIRE(out_.good(), "[log] metrics: write to '", path_, "' failed");
}

}  // namespace lockstep
