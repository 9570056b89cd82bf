#include "src/train/metrics.hpp"

#include <cblas.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "src/core/check.hpp"

namespace lockstep {

double peak_memory_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return 0.0;
}

double measure_sgemm_peak_gflops() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  };
  run();  // warm-up: page faults, thread start
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

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
