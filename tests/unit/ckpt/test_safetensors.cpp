// safetensors export: the byte layout of the specification (u64 little-endian header length, JSON
// header with dtype/shape/data_offsets per tensor and __metadata__, 8-byte aligned data, raw
// little-endian elements), checked by decoding the bytes here independently of the writer; the
// refused inputs; and the file written by save_safetensors.
#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include <nlohmann/json.hpp>

#include "src/ckpt/safetensors.hpp"
#include "tests/support/temp_dir.hpp"

namespace lockstep::ckpt {
namespace {

using nlohmann::json;

struct Decoded {
  uint64_t header_len;
  json header;
  std::string data;
};

Decoded decode(const std::string& bytes) {
  EXPECT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  return {n, json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Safetensors, LayoutMatchesTheSpecification) {
  const std::vector<float> a{1.0f, -2.5f, 3.0f, 0.125f, 7.0f, -0.0f};  // (2, 3)
  const std::vector<int32_t> b{42, -7, 5};                             // (3)
  const std::vector<uint16_t> c{0x3f80};                               // bf16 1.0, scalar
  const std::vector<TensorRef> tensors{{"layer/0/w", DType::kF32, {2, 3}, a.data()},
                                       {"ids", DType::kI32, {3}, b.data()},
                                       {"one", DType::kBF16, {}, c.data()}};
  const std::string bytes = safetensors_bytes(tensors, {{"producer", "lockstep"}, {"step", "7"}});
  const Decoded d = decode(bytes);

  EXPECT_EQ((8 + d.header_len) % 8, 0u) << "data must start 8-byte aligned";
  EXPECT_EQ(d.header["__metadata__"], json({{"producer", "lockstep"}, {"step", "7"}}));
  EXPECT_EQ(d.header["layer/0/w"], json({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}));
  EXPECT_EQ(d.header["ids"], json({{"dtype", "I32"}, {"shape", {3}}, {"data_offsets", {24, 36}}}));
  EXPECT_EQ(d.header["one"], json({{"dtype", "BF16"}, {"shape", json::array()}, {"data_offsets", {36, 38}}}));
  EXPECT_EQ(d.header.size(), 4u);
  EXPECT_EQ(d.data, raw(a) + raw(b) + raw(c)) << "data: the tensors back to back in the given order";
  // The header is JSON padded with spaces only.
  const std::string text = bytes.substr(8, d.header_len);
  EXPECT_EQ(text.find_last_not_of(' '), text.rfind('}'));
}

TEST(Safetensors, WithoutMetadataHasNoMetadataKey) {
  const std::vector<double> x{0.5};
  const Decoded d = decode(safetensors_bytes({{"x", DType::kF64, {1}, x.data()}}, {}));
  EXPECT_FALSE(d.header.contains("__metadata__"));
  EXPECT_EQ(d.header["x"]["dtype"], "F64");
  EXPECT_EQ(d.data, raw(x));
}

TEST(Safetensors, DtypeNames) {
  EXPECT_EQ(safetensors_dtype(DType::kF16), "F16");
  EXPECT_EQ(safetensors_dtype(DType::kE4M3), "F8_E4M3");
  EXPECT_EQ(safetensors_dtype(DType::kE5M2), "F8_E5M2");
  EXPECT_EQ(safetensors_dtype(DType::kI64), "I64");
  EXPECT_EQ(safetensors_dtype(DType::kU8), "U8");
}

void expect_config_error(const std::vector<TensorRef>& tensors, const std::string& pattern) {
  try {
    safetensors_bytes(tensors, {});
    ADD_FAILURE() << "no error, expected /" << pattern << "/";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern))) << e.what();
  }
}

TEST(Safetensors, RefusesBadNamesAndDtypes) {
  const float v = 1.0f;
  expect_config_error({{"", DType::kF32, {1}, &v}}, "empty name");
  expect_config_error({{"w", DType::kF32, {1}, &v}, {"w", DType::kF32, {1}, &v}}, "'w' appears twice");
  expect_config_error({{"__metadata__", DType::kF32, {1}, &v}}, "'__metadata__' is reserved");
  expect_config_error({{"s", DType::kE8M0, {1}, &v}}, "safetensors has no dtype for e8m0");
}

TEST(Safetensors, SaveWritesTheSameBytes) {
  test::TempDir dir("ls_safetensors_");
  const std::vector<float> w{1, 2, 3, 4};
  const std::vector<TensorRef> tensors{{"w", DType::kF32, {2, 2}, w.data()}};
  save_safetensors(dir.file("m.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_EQ(test::read_text(dir.file("m.safetensors")), safetensors_bytes(tensors, {{"format", "pt"}}));
}

}  // namespace
}  // namespace lockstep::ckpt
