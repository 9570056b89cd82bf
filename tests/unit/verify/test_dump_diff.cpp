// Tensor dumps and diff (verify/core/dump.hpp, verify/diff.hpp): the .npy header bytes, write/read
// round trips, rejected files, step and name selection, and elementwise diff verdicts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "verify/core/compare.hpp"
#include "verify/diff.hpp"
#include "verify/core/dump.hpp"

namespace lockstep::verify {
namespace {

namespace fs = std::filesystem;

// A fresh scratch directory per test, removed afterwards.
class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::temp_directory_path() / ("lockstep_dump_" + std::to_string(getpid()) + "_" + info->name())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST(Npy, HeaderBytesMatchNumpyFormat10) {
  const std::vector<int64_t> shape = {2, 3};
  const std::string h = npy_header_f32(shape);
  ASSERT_EQ(h.size(), 128u);  // 10 + dict (59) + '\n', padded to a multiple of 64
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>(h[8]) | (static_cast<unsigned char>(h[9]) << 8), 118);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(h.substr(10, dict.size()), dict);
  EXPECT_EQ(h.back(), '\n');
  EXPECT_EQ(h.find_first_not_of(' ', 10 + dict.size()), h.size() - 1);
  // Byte for byte what numpy.save writes for numpy.zeros((2, 3), '<f4').
  EXPECT_EQ(h, std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + std::string(58, ' ') + "\n");
}

TEST(Npy, ShapeTuplesAsPythonWritesThem) {
  const std::vector<int64_t> scalar, vec = {4}, big = {8, 64, 257, 3, 5, 7, 11, 13};
  EXPECT_NE(npy_header_f32(scalar).find("'shape': (), }"), std::string::npos);
  EXPECT_NE(npy_header_f32(vec).find("'shape': (4,), }"), std::string::npos);
  EXPECT_EQ(npy_header_f32(big).size() % 64, 0u);
  EXPECT_NE(npy_header_f32(big).find("(8, 64, 257, 3, 5, 7, 11, 13)"), std::string::npos);
}

TEST_F(DumpTest, NpyRoundTripKeepsBitsAndShape) {
  const std::vector<float> data = {1.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), 3.5e-42f, -7.25f, 1e30f};
  const std::vector<int64_t> shape = {3, 2};
  const uint64_t h = write_npy_f32(path("t.npy"), data.data(), shape);
  EXPECT_EQ(h, xxh64(data.data(), data.size() * sizeof(float)));
  std::vector<int64_t> got_shape;
  const std::vector<float> got = read_npy_f32(path("t.npy"), got_shape);
  EXPECT_EQ(got_shape, shape);
  ASSERT_EQ(got.size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(float_bits(got[i]), float_bits(data[i])) << i;

  const float loss = 2.5f;
  write_npy_f32(path("s.npy"), &loss, {});
  EXPECT_EQ(read_npy_f32(path("s.npy"), got_shape), std::vector<float>{2.5f});
  EXPECT_TRUE(got_shape.empty());
}

TEST_F(DumpTest, TruncatedOrForeignNpyIsRejectedNamingTheFile) {
  const std::vector<float> data(10, 1.0f);
  const std::vector<int64_t> shape = {10};
  write_npy_f32(path("t.npy"), data.data(), shape);
  fs::resize_file(path("t.npy"), 64 + 9 * 4 + 2);
  std::vector<int64_t> s;
  try {
    read_npy_f32(path("t.npy"), s);
    FAIL() << "a truncated file was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path("t.npy")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  durable_io::write_file_atomic(path("x.npy"), "PK\x03\x04 not numpy at all");
  EXPECT_THROW(read_npy_f32(path("x.npy"), s), DataError);
  EXPECT_THROW(read_npy_f32(path("absent.npy"), s), DataError);
}

TEST(DumpSelection, StepsAndNames) {
  const StepSet all;
  EXPECT_TRUE(all.contains(12345));
  const StepSet some("3,7,10-12", "steps");
  for (int64_t s : {3, 7, 10, 11, 12}) EXPECT_TRUE(some.contains(s)) << s;
  for (int64_t s : {0, 4, 9, 13}) EXPECT_FALSE(some.contains(s)) << s;
  EXPECT_THROW(StepSet("1-x", "steps"), ConfigError);
  EXPECT_THROW(StepSet("5-2", "steps"), ConfigError);
  EXPECT_THROW(StepSet("3,,4", "steps"), ConfigError);

  const NameFilter f("layer/*/attn/*,loss,grad/*");
  EXPECT_TRUE(f.matches("layer/3/attn/qkv"));
  EXPECT_TRUE(f.matches("loss"));
  EXPECT_TRUE(f.matches("grad/layer/0/mlp/act"));
  EXPECT_FALSE(f.matches("layer/3/mlp/fc"));
  EXPECT_FALSE(f.matches("losses"));
  EXPECT_TRUE(NameFilter("").matches("anything"));
}

TEST(Diff, EqualArraysAgreeBitwise) {
  const std::vector<float> a = {1, 2, std::nanf(""), -0.0f};
  const TensorDiff d = diff_arrays(a.data(), a.data(), 4, {});
  EXPECT_TRUE(d.ok());
  EXPECT_TRUE(d.bitwise_equal);
  EXPECT_EQ(d.max_ulp, 0u);
  EXPECT_EQ(d.first_index, -1);
}

TEST(Diff, DifferentArraysReportTheFirstMismatchAndTheWorstError) {
  const std::vector<float> a = {1, 2, 3, 4};
  std::vector<float> b = a;
  b[1] = std::nextafter(2.0f, 3.0f);  // 1 ulp
  b[3] = 4.5f;
  const TensorDiff exact = diff_arrays(a.data(), b.data(), 4, {});
  EXPECT_FALSE(exact.ok());
  EXPECT_EQ(exact.mismatches, 2);
  EXPECT_DOUBLE_EQ(exact.fraction(), 0.5);
  EXPECT_EQ(exact.first_index, 1);
  EXPECT_EQ(exact.first_a, 2.0f);
  EXPECT_EQ(exact.first_b, b[1]);
  EXPECT_DOUBLE_EQ(exact.max_abs_err, 0.5);
  EXPECT_DOUBLE_EQ(exact.max_rel_err, 0.5 / 4.5);
  EXPECT_EQ(exact.max_ulp, ulp_distance(4.0f, 4.5f));

  const TensorDiff loose = diff_arrays(a.data(), b.data(), 4, DiffMode::parse("ulp:1", "--mode"));
  EXPECT_FALSE(loose.bitwise_equal);
  EXPECT_EQ(loose.mismatches, 1);  // only the 4 vs 4.5 element
  EXPECT_EQ(loose.first_index, 3);

  const float nan = std::nanf(""), one = 1.0f;
  EXPECT_FALSE(diff_arrays(&nan, &one, 1, DiffMode::parse("ulp:1000", "--mode")).ok());
  EXPECT_THROW(DiffMode::parse("ulp:", "--mode"), ConfigError);
  EXPECT_THROW(DiffMode::parse("bounds", "--mode"), ConfigError);
}

// Writes a two-step dump whose step 1 `layer/0/x` is `x1` (two micro-batches of shape (1, 3)).
void write_dump(const std::string& dir, float x1) {
  DumpWriter w(dir, "layer/*,loss", "", {{"model", 1}}, {{"dp", 1}});
  const std::vector<int64_t> mb = {1, 3};
  for (int64_t step = 0; step < 2; ++step) {
    w.begin_step(step);
    const std::vector<float> m0 = {1, 2, 3}, m1 = {4, 5, step == 1 ? x1 : 6.0f};
    w.observe("layer/0/x", m0.data(), mb);
    w.observe("ignored/by/filter", m0.data(), mb);
    w.observe("layer/0/x", m1.data(), mb);
    const float loss = 1.5f;
    w.add("loss", &loss, {});
    w.end_step();
  }
}

TEST_F(DumpTest, WriterConcatenatesMicroBatchesAndDiffNamesTheFirstDivergence) {
  write_dump(path("a"), 6.0f);
  write_dump(path("b"), 6.0f);
  write_dump(path("c"), 6.5f);
  const Dump a = read_dump(path("a"));
  ASSERT_EQ(a.entries.size(), 4u);
  EXPECT_EQ(a.entries[0].name, "step/0/layer/0/x");
  EXPECT_EQ(a.entries[1].name, "step/0/loss");
  EXPECT_EQ(a.entries[2].name, "step/1/layer/0/x");
  EXPECT_EQ(a.entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(load_entry(a, a.entries[2]), (std::vector<float>{1, 2, 3, 4, 5, 6}));

  const DiffReport same = diff_dumps(path("a"), path("b"), {});
  EXPECT_TRUE(same.agree());
  EXPECT_EQ(same.tensors.size(), 4u);

  const DiffReport differ = diff_dumps(path("a"), path("c"), {});
  EXPECT_FALSE(differ.agree());
  ASSERT_TRUE(differ.first_divergent.has_value());
  const TensorDiff& d = differ.tensors[*differ.first_divergent];
  EXPECT_EQ(d.name, "step/1/layer/0/x");
  EXPECT_EQ(d.first_index, 5);
  EXPECT_EQ(differ.to_json()["first_divergent"], "step/1/layer/0/x");
  EXPECT_EQ(differ.to_json()["tensors"][2]["first_mismatch"]["index"], (std::vector<int64_t>{1, 2}));

  // A dump directory is not overwritten.
  EXPECT_THROW(write_dump(path("a"), 6.0f), ConfigError);
}

TEST_F(DumpTest, CorruptManifestOrPayloadIsADataErrorNamingTheFile) {
  write_dump(path("a"), 6.0f);
  write_dump(path("b"), 6.0f);
  // Same size, other bytes: only the xxh64 in the manifest catches it.
  const std::vector<float> other = {9, 9, 9, 9, 9, 9};
  const std::vector<int64_t> shape = {2, 3};
  write_npy_f32(path("b/step_1/layer.0.x.npy"), other.data(), shape);
  try {
    diff_dumps(path("a"), path("b"), {});
    FAIL() << "a changed payload was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("step_1/layer.0.x.npy: payload xxh64"), std::string::npos) << e.what();
  }
  durable_io::write_file_atomic(path("b/manifest.json"), "{\"format\": ");
  EXPECT_THROW(read_dump(path("b")), DataError);
  EXPECT_THROW(read_dump(path("nothing")), DataError);
}

}  // namespace
}  // namespace lockstep::verify
