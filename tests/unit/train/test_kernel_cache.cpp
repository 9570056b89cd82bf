// Tests of the kernel cache (src/train/kernel_cache.hpp): where it lives, what it keys on, that an
// entry is found only for its machine key and build, that a bad file is reported and replaced but
// never stops a run, and that a run measures once and then reads its figures back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/comm/communicator.hpp"
#include "src/train/kernel_cache.hpp"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& name) : path(fs::temp_directory_path() / ("ls_kernel_cache_" + name)) {
    fs::remove_all(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

GemmPeak figures(double openblas, double canonical, double fast, double bf16) {
  GemmPeak p;
  p.openblas_gflops = openblas;
  p.canonical_gflops = canonical;
  p.fast_gflops = fast;
  p.bf16_dot_gflops = bf16;
  return with_fastest(p);
}

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(KernelCache, PathFromTheSetting) {
  EXPECT_EQ(kernel_cache_path("off"), "");
  EXPECT_EQ(kernel_cache_path("/tmp/k.json"), "/tmp/k.json");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old != nullptr ? old : "";
  setenv("XDG_CACHE_HOME", "/somewhere", 1);
  EXPECT_EQ(kernel_cache_path("auto"), "/somewhere/lockstep/kernels.json");
  if (old != nullptr) {
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    unsetenv("XDG_CACHE_HOME");
  }
}

TEST(KernelCache, KeyNamesThreadsRanksAndOpenBlasKernel) {
  const CpuBackend backend = CpuBackend::current();
  const std::string one = kernel_cache_key(backend, 1), four = kernel_cache_key(backend, 4);
  EXPECT_NE(one, four);
  EXPECT_NE(one.find(std::to_string(backend.threads()) + " thread"), std::string::npos) << one;
  EXPECT_NE(one.find("OpenBLAS " + backend.blas_core()), std::string::npos) << one;
  EXPECT_NE(four.find("4 ranks"), std::string::npos) << four;
  EXPECT_FALSE(build_identity().empty());
}

TEST(KernelCache, EntryFoundOnlyForItsKeyAndBuild) {
  ScratchDir dir("entries");
  const std::string path = dir.file("sub/kernels.json");  // the folder is made on write
  std::string problem;
  EXPECT_FALSE(read_kernel_cache(path, "k1", "b1", &problem));  // no file: no entry, no problem
  EXPECT_EQ(problem, "");
  ASSERT_EQ(write_kernel_cache(path, "k1", "b1", figures(100, 120, 130, 400)), "");
  ASSERT_EQ(write_kernel_cache(path, "k2", "b1", figures(50, 60, 70, 0)), "");
  const auto hit = read_kernel_cache(path, "k1", "b1", &problem);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->peak.openblas_gflops, 100);
  EXPECT_EQ(hit->peak.canonical_gflops, 120);
  EXPECT_EQ(hit->peak.fast_gflops, 130);
  EXPECT_EQ(hit->peak.bf16_dot_gflops, 400);
  EXPECT_EQ(hit->peak.gflops, 130);  // the fastest fp32 candidate, recomputed
  EXPECT_FALSE(hit->measured_at.empty());
  EXPECT_TRUE(read_kernel_cache(path, "k2", "b1", &problem));
  EXPECT_FALSE(read_kernel_cache(path, "k3", "b1", &problem));
  EXPECT_FALSE(read_kernel_cache(path, "k1", "b2", &problem));  // another build measures again
  // A new build's entry replaces the file: the old build's entries are gone.
  ASSERT_EQ(write_kernel_cache(path, "k1", "b2", figures(10, 20, 30, 0)), "");
  EXPECT_FALSE(read_kernel_cache(path, "k2", "b1", &problem));
  EXPECT_FALSE(read_kernel_cache(path, "k2", "b2", &problem));
  EXPECT_EQ(read_kernel_cache(path, "k1", "b2", &problem)->peak.fast_gflops, 30);
  EXPECT_EQ(problem, "");
}

TEST(KernelCache, MalformedFileIsReportedAndReplaced) {
  ScratchDir dir("malformed");
  const std::string path = dir.file("kernels.json");
  for (const std::string& text : {std::string("{\"version\": 1, \"build\": \"b\", \"ent"), std::string("[1, 2]"),
                                 std::string("{\"version\": 1, \"build\": \"b\", \"entries\": {\"k\": "
                                             "{\"openblas_gflops\": -1, \"canonical_gflops\": 1, "
                                             "\"fast_gflops\": 1, \"bf16_dot_gflops\": 0}}}")}) {
    write_text(path, text);
    std::string problem;
    EXPECT_FALSE(read_kernel_cache(path, "k", "b", &problem)) << text;
    EXPECT_NE(problem.find(path), std::string::npos) << problem;
    ASSERT_EQ(write_kernel_cache(path, "k", "b", figures(1, 2, 3, 0)), "");
    problem.clear();
    EXPECT_TRUE(read_kernel_cache(path, "k", "b", &problem)) << problem;
  }
}

TEST(KernelCache, UnwritablePathIsReportedNotThrown) {
  ScratchDir dir("unwritable");
  write_text(dir.file("file"), "x");
  const std::string failed = write_kernel_cache(dir.file("file/kernels.json"), "k", "b", figures(1, 2, 3, 0));
  EXPECT_FALSE(failed.empty());
}

// One rank: the first start measures and caches, the second reads the same figures back.
TEST(KernelCache, RunMeasuresOnceThenReadsBack) {
  ScratchDir dir("run");
  const std::string path = dir.file("kernels.json");
  const CpuBackend backend = CpuBackend::current();
  comm::SelfCommunicator self("world");
  std::string note;
  const GemmPeak first = agreed_gemm_peak(backend, path, self, &note);
  EXPECT_NE(note.find("measured now; cached in " + path), std::string::npos) << note;
  EXPECT_GT(first.gflops, 0);
  const GemmPeak second = agreed_gemm_peak(backend, path, self, &note);
  EXPECT_NE(note.find("from the cache " + path), std::string::npos) << note;
  EXPECT_EQ(second.openblas_gflops, first.openblas_gflops);
  EXPECT_EQ(second.canonical_gflops, first.canonical_gflops);
  EXPECT_EQ(second.fast_gflops, first.fast_gflops);
  EXPECT_EQ(second.bf16_dot_gflops, first.bf16_dot_gflops);
  EXPECT_EQ(second.source, first.source);
  // Off: measured every time, nothing written.
  agreed_gemm_peak(backend, "", self, &note);
  EXPECT_NE(note.find("kernel_cache is off"), std::string::npos) << note;
}

}  // namespace
}  // namespace lockstep
