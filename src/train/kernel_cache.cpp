#include "src/train/kernel_cache.hpp"

#include <sys/stat.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/cpu/matmul.hpp"
#include "src/comm/communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"

namespace lockstep {

namespace {

// The file's layout; a file of another version is rewritten whole.
constexpr int kCacheVersion = 1;

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The candidates' figures in a fixed order, for the file and for the ranks' agreement.
std::array<double, 4> figures_of(const GemmPeak& p) {
  return {p.openblas_gflops, p.canonical_gflops, p.fast_gflops, p.bf16_dot_gflops};
}
GemmPeak peak_of(const std::array<double, 4>& f) {
  GemmPeak p;
  p.openblas_gflops = f[0];
  p.canonical_gflops = f[1];
  p.fast_gflops = f[2];
  p.bf16_dot_gflops = f[3];
  return with_fastest(p);
}

constexpr const char* kFigureNames[4] = {"openblas_gflops", "canonical_gflops", "fast_gflops", "bf16_dot_gflops"};

// The file's contents, or an empty object where it does not exist. Throws DataError naming the
// path when it cannot be read or is not a cache file.
nlohmann::json load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nlohmann::json::object();
  std::ifstream in(path);
  LS_REQUIRE_DATA(in.good(), path, ": cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": not a kernel cache (JSON parse error: " + e.what() + ")");
  }
  LS_REQUIRE_DATA(j.is_object() && j.contains("version") && j["version"].is_number_integer(), path,
                  ": not a kernel cache (expected a JSON object with an integer \"version\")");
  return j;
}

}  // namespace

std::string kernel_cache_path(const std::string& setting) {
  if (setting == "off") return "";
  if (setting != "auto") return setting;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/lockstep/kernels.json";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/lockstep/kernels.json";
  }
  return "";
}

std::string kernel_cache_key(const CpuBackend& backend, int ranks) {
  std::ostringstream key;
  key << cpu_model_name() << "; " << backend.isa_name() << "; "
      << (cpu::bf16_dot_supported() ? "avx512bf16" : "no avx512bf16") << "; " << backend.threads()
      << (backend.threads() == 1 ? " thread" : " threads") << "; OpenBLAS " << backend.blas_core() << "; " << ranks << (ranks == 1 ? " rank" : " ranks");
  return key.str();
}

std::string build_identity() {
  struct stat st {};
  if (stat("/proc/self/exe", &st) != 0) return "unknown build";
  return std::to_string(st.st_size) + "-" +
         std::to_string(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
}

std::optional<CachedPeak> read_kernel_cache(const std::string& path, const std::string& key,
                                            const std::string& build, std::string* problem) {
  try {
    const nlohmann::json j = load(path);
    if (j.empty() || j["version"] != kCacheVersion || j.value("build", "") != build) return std::nullopt;
    if (!j.contains("entries") || !j["entries"].is_object() || !j["entries"].contains(key)) return std::nullopt;
    const nlohmann::json& e = j["entries"][key];
    std::array<double, 4> f{};
    for (int i = 0; i < 4; ++i) {
      LS_REQUIRE_DATA(e.contains(kFigureNames[i]) && e[kFigureNames[i]].is_number() &&
                          e[kFigureNames[i]].get<double>() >= 0,
                      path, ": entry \"", key, "\": expected a number >= 0 for \"", kFigureNames[i], "\"");
      f[static_cast<size_t>(i)] = e[kFigureNames[i]].get<double>();
    }
    LS_REQUIRE_DATA(f[0] > 0 && f[1] > 0 && f[2] > 0, path, ": entry \"", key,
                    "\": the fp32 candidates' figures must be positive");
    return CachedPeak{peak_of(f), e.value("measured_at", std::string("unknown time"))};
  } catch (const InputError& e) {
    if (problem != nullptr) *problem = e.what();
    return std::nullopt;
  }
}

std::string write_kernel_cache(const std::string& path, const std::string& key, const std::string& build,
                               const GemmPeak& peak) {
  try {
    nlohmann::json j;
    try {
      j = load(path);
    } catch (const InputError&) {
      j = nlohmann::json::object();  // a malformed file is replaced
    }
    if (j.empty() || j["version"] != kCacheVersion || j.value("build", "") != build || !j.contains("entries") ||
        !j["entries"].is_object()) {
      j = {{"version", kCacheVersion}, {"build", build}, {"entries", nlohmann::json::object()}};
    }
    nlohmann::json e = {{"measured_at", utc_now()}};
    const auto f = figures_of(peak);
    for (int i = 0; i < 4; ++i) e[kFigureNames[i]] = f[static_cast<size_t>(i)];
    j["entries"][key] = e;
    const auto dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    durable_io::write_file_atomic(path, j.dump(2) + "\n");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

GemmPeak agreed_gemm_peak(const CpuBackend& backend, const std::string& cache_path, comm::Communicator& world,
                          std::string* note) {
  const std::string key = kernel_cache_key(backend, world.size());
  const std::string build = build_identity();
  std::string problem, cached_at;
  // Rank 0's cache entry: hit flag then the figures, the same on every rank after the broadcast.
  std::array<double, 5> shared{};
  if (world.rank() == 0 && !cache_path.empty()) {
    if (const auto hit = read_kernel_cache(cache_path, key, build, &problem)) {
      const auto f = figures_of(hit->peak);
      shared = {1.0, f[0], f[1], f[2], f[3]};
      cached_at = hit->measured_at;
    }
  }
  if (world.size() > 1) world.broadcast(shared.data(), 5, DType::kF64, 0);
  std::array<double, 4> f{shared[1], shared[2], shared[3], shared[4]};
  const bool hit = shared[0] != 0.0;
  if (!hit) {
    f = figures_of(backend.measure_gemm_peak());
    if (world.size() > 1) world.all_reduce(f.data(), f.data(), 4, DType::kF64, comm::ReduceOp::kMax);
  }
  const GemmPeak peak = peak_of(f);
  if (world.rank() != 0 || note == nullptr) return peak;
  std::ostringstream n;
  if (cache_path.empty()) {
    n << "measured now; [train] kernel_cache is off";
  } else if (hit) {
    n << "from the cache " << cache_path << ", measured " << cached_at;
  } else {
    const std::string failed = write_kernel_cache(cache_path, key, build, peak);
    n << "measured now" << (world.size() > 1 ? " by every rank, highest figures kept" : "");
    if (failed.empty()) {
      n << "; cached in " << cache_path;
    } else {
      n << "; not cached: " << failed;
    }
  }
  if (!problem.empty()) n << "; the cache was not used: " << problem;
  *note = n.str();
  return peak;
}

}  // namespace lockstep
