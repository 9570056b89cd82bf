// DumpWriter over a data-parallel group (verify/core/dump.hpp): each rank observes its micro-batches of
// the global batch, rank 0 writes the global tensors, and the files are byte for byte those of a
// single-process writer that observed the whole batch (same xxh64 in both manifests).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "tests/mpi/mpi_env.hpp"
#include "verify/core/dump.hpp"

namespace lockstep::verify {
namespace {

using test::g_world;

constexpr int64_t kRowsPerRank = 4, kMicro = 2, kT = 3, kC = 5;

// Element (row, t, c) of the global batch tensor `salt`: distinct everywhere, exact in fp32.
float value(int salt, int64_t row, int64_t t, int64_t c) {
  return static_cast<float>(salt * 100000 + row * 1000 + t * 10 + c) * 0.25f;
}

// Observes rows [first, first + n) of two batch tensors in micro-batches, and one whole tensor.
void observe_rows(DumpWriter& w, int64_t first, int64_t n) {
  for (int64_t mb = first; mb < first + n; mb += kMicro) {
    for (int salt : {1, 2}) {
      std::vector<float> x;
      for (int64_t r = mb; r < mb + kMicro; ++r) {
        for (int64_t t = 0; t < kT; ++t) {
          for (int64_t c = 0; c < kC; ++c) x.push_back(value(salt, r, t, c));
        }
      }
      const std::vector<int64_t> shape = {kMicro, kT, kC};
      w.observe(salt == 1 ? "layer/0/attn/qkv" : "grad/logits", x.data(), shape);
    }
  }
  const float loss = 2.5f;  // the reduced loss: equal on every rank
  w.add("loss", &loss, {});
}

// One directory name for all ranks: rank 0's, broadcast.
std::string shared_dir(const std::string& tag) {
  char buf[256] = {};
  if (g_world->rank() == 0) {
    const auto p = std::filesystem::temp_directory_path() / ("lockstep_dump_gather_" + std::to_string(getpid()) + tag);
    std::filesystem::remove_all(p);
    std::snprintf(buf, sizeof buf, "%s", p.c_str());
  }
  g_world->broadcast(buf, sizeof buf, DType::kU8, 0);
  return buf;
}

TEST(DumpGather, RankZeroWritesTheGlobalBatchInRankOrder) {
  const int P = g_world->size();
  const std::string dir = shared_dir("_dp"), single = dir + "_single";
  {
    DumpWriter w(dir, "", "0", nlohmann::json::object(), nlohmann::json::object(), g_world);
    w.begin_step(0);
    observe_rows(w, g_world->rank() * kRowsPerRank, kRowsPerRank);
    w.end_step();
  }
  g_world->barrier();
  if (g_world->rank() == 0) {
    DumpWriter one(single, "", "0", nlohmann::json::object(), nlohmann::json::object());
    one.begin_step(0);
    observe_rows(one, 0, P * kRowsPerRank);
    one.end_step();

    const Dump d = read_dump(dir), s = read_dump(single);
    ASSERT_EQ(d.entries.size(), 3u);
    ASSERT_EQ(s.entries.size(), 3u);
    for (size_t i = 0; i < d.entries.size(); ++i) {
      EXPECT_EQ(d.entries[i].name, s.entries[i].name);
      EXPECT_EQ(d.entries[i].shape, s.entries[i].shape);
      EXPECT_EQ(d.entries[i].xxh64, s.entries[i].xxh64) << d.entries[i].name;
    }
    const DumpEntry& qkv = d.entries[0];
    EXPECT_EQ(qkv.name, "step/0/layer/0/attn/qkv");
    EXPECT_EQ(qkv.shape, (std::vector<int64_t>{P * kRowsPerRank, kT, kC}));
    const std::vector<float> x = load_entry(d, qkv);
    for (int64_t r = 0; r < P * kRowsPerRank; ++r) {
      EXPECT_EQ(x[(r * kT + 2) * kC + 4], value(1, r, 2, 4)) << "global row " << r;
    }
    EXPECT_EQ(d.entries[2].shape, std::vector<int64_t>{});
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(single);
  }
  g_world->barrier();
}

TEST(DumpGather, StepsOutsideTheSetAreNotGathered) {
  const std::string dir = shared_dir("_steps");
  {
    DumpWriter w(dir, "layer/*", "1", nlohmann::json::object(), nlohmann::json::object(), g_world);
    for (int64_t step = 0; step < 2; ++step) {
      w.begin_step(step);
      observe_rows(w, g_world->rank() * kRowsPerRank, kRowsPerRank);
      w.end_step();
    }
  }
  g_world->barrier();
  if (g_world->rank() == 0) {
    const Dump d = read_dump(dir);
    ASSERT_EQ(d.entries.size(), 1u);  // the filter keeps layer/0/attn/qkv; step 0 is not dumped
    EXPECT_EQ(d.entries[0].name, "step/1/layer/0/attn/qkv");
    EXPECT_EQ(d.entries[0].shape[0], g_world->size() * kRowsPerRank);
    std::filesystem::remove_all(dir);
  }
  g_world->barrier();
}

}  // namespace
}  // namespace lockstep::verify
