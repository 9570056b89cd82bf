// Checkpoint save/load: bitwise round trips, the manifest, retention, durability leftovers,
// corruption detection with named files, load_latest fallback, and the model hash.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "src/ckpt/checkpoint.hpp"
#include "src/core/hash.hpp"
#include "tests/support/temp_dir.hpp"

namespace lockstep::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::write_text;

// A tensor that owns its bytes, filled from a seeded generator so that contents differ per tensor.
struct Owned {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  Owned(std::string n, DType t, std::vector<int64_t> s, uint64_t seed)
      : name(std::move(n)), dtype(t), shape(std::move(s)) {
    bytes.resize(static_cast<size_t>(numel(shape)) * dtype_size(dtype));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::byte& b : bytes) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::byte>(x >> 56);
    }
  }
  TensorRef ref() const { return {name, dtype, shape, bytes.data()}; }
};

std::vector<TensorRef> refs(const std::vector<Owned>& ts) {
  std::vector<TensorRef> out;
  for (const Owned& t : ts) out.push_back(t.ref());
  return out;
}

std::vector<Owned> sample_tensors() {
  std::vector<Owned> ts;
  ts.emplace_back("model/wte", DType::kF32, std::vector<int64_t>{3, 5}, 1);
  ts.emplace_back("model/ln.weight", DType::kBF16, std::vector<int64_t>{7}, 2);
  ts.emplace_back("optim/m/wte", DType::kF64, std::vector<int64_t>{2, 3, 4}, 3);
  ts.emplace_back("data/cursor", DType::kI64, std::vector<int64_t>{}, 4);
  ts.emplace_back("model/empty", DType::kF32, std::vector<int64_t>{0, 4}, 5);
  ts.emplace_back("model/fp8", DType::kE4M3, std::vector<int64_t>{9}, 6);
  ts.emplace_back("rng/state", DType::kU8, std::vector<int64_t>{33}, 7);
  return ts;
}

template <class F>
void expect_data_error(F&& f, const std::string& pattern) {
  try {
    f();
    ADD_FAILURE() << "expected a DataError matching /" << pattern << "/";
  } catch (const DataError& e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern)))
        << "message: " << e.what() << "\npattern: " << pattern;
  }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x01));
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// root_ does not exist yet: save() creates it.
class CheckpointTest : public ::testing::Test {
 protected:
  test::TempDir scratch_{"ls_ckpt_test_"};
  std::string root_ = scratch_.file("ckpt");
};

void expect_same_tensors(const Checkpoint& c, const std::vector<Owned>& ts) {
  ASSERT_EQ(c.tensors.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const StoredTensor& s = c.tensors[i];
    EXPECT_EQ(s.name, ts[i].name);
    EXPECT_EQ(s.dtype, ts[i].dtype) << s.name;
    EXPECT_EQ(s.shape, ts[i].shape) << s.name;
    EXPECT_EQ(s.bytes, ts[i].bytes) << s.name;  // bitwise
    EXPECT_EQ(s.xxh64, xxh64(ts[i].bytes.data(), ts[i].bytes.size())) << s.name;
  }
}

TEST_F(CheckpointTest, RoundTripIsBitwiseForSeveralDtypesAndShapes) {
  const auto ts = sample_tensors();
  const json state = {{"step", 42}, {"rng", {{"seed", 7}, {"offset", 123456789012345ll}}},
                      {"config", "[model]\nn_layer = 2\n"}, {"loss", 3.25}};
  const std::string dir = save(root_, 42, refs(ts), state, 0);
  EXPECT_EQ(dir, root_ + "/step_00000042");

  const Checkpoint c = load(dir);
  EXPECT_EQ(c.dir, dir);
  EXPECT_EQ(c.step, 42);
  EXPECT_EQ(c.state, state);
  expect_same_tensors(c, ts);
  std::vector<std::string> want_names;
  for (const Owned& t : ts) want_names.push_back(t.name);
  EXPECT_EQ(c.names(), want_names);

  std::vector<std::byte> buf(ts[2].bytes.size());
  c.copy_to("optim/m/wte", DType::kF64, {2, 3, 4}, buf.data());
  EXPECT_EQ(buf, ts[2].bytes);
  EXPECT_TRUE(c.has("model/fp8"));
  EXPECT_FALSE(c.has("model/nope"));
}

TEST_F(CheckpointTest, CopyToAndTensorRejectWrongRequests) {
  const auto ts = sample_tensors();
  const Checkpoint c = load(save(root_, 1, refs(ts), json::object(), 0));
  std::vector<std::byte> buf(1024);
  expect_data_error([&] { c.copy_to("model/wte", DType::kBF16, {3, 5}, buf.data()); },
                    "step_00000001: tensor 'model/wte' is f32 \\[3, 5\\], expected bf16 \\[3, 5\\]");
  expect_data_error([&] { c.copy_to("model/wte", DType::kF32, {5, 3}, buf.data()); },
                    "is f32 \\[3, 5\\], expected f32 \\[5, 3\\]");
  expect_data_error([&] { c.tensor("model/nope"); }, "step_00000001 has no tensor 'model/nope'");
}

TEST_F(CheckpointTest, ManifestDescribesEveryTensorAndFile) {
  const auto ts = sample_tensors();
  const std::string dir = save(root_, 7, refs(ts), json{{"note", "x"}}, 0);
  const json m = read_json(dir + "/manifest.json");
  EXPECT_EQ(m["format"], "lockstep-checkpoint");
  EXPECT_EQ(m["version"], 2);
  EXPECT_EQ(m["step"], 7);
  EXPECT_EQ(m["layout"], (json{{"dp", 1}, {"tp", 1}, {"pp", 1}}));
  EXPECT_EQ(m["state"], (json{{"note", "x"}}));
  EXPECT_EQ(m["model_hash"], hex64(model_hash(refs(ts))));

  ASSERT_EQ(m["files"].size(), 1u);
  const std::string data_file = m["files"][0]["name"];
  EXPECT_EQ(m["files"][0]["bytes"].get<uint64_t>(), fs::file_size(dir + "/" + data_file));
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"manifest.json", data_file}));

  ASSERT_EQ(m["tensors"].size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const json& e = m["tensors"][i];
    EXPECT_EQ(e["name"], ts[i].name);
    EXPECT_EQ(e["dtype"], std::string(dtype_name(ts[i].dtype)));
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), ts[i].shape);
    EXPECT_EQ(e["bytes"].get<size_t>(), ts[i].bytes.size());
    ASSERT_EQ(e["shards"].size(), 1u);
    const json& s = e["shards"][0];
    EXPECT_EQ(s["split_dim"], -1);  // the whole tensor
    EXPECT_EQ(s["elements"], (json{0, numel(ts[i].shape)}));
    EXPECT_EQ(s["file"], data_file);
    EXPECT_EQ(s["offset"].get<uint64_t>() % kDataAlignment, 0u);
    EXPECT_GE(s["offset"].get<uint64_t>(), kDataHeaderBytes);
    EXPECT_EQ(s["bytes"].get<size_t>(), ts[i].bytes.size());
    EXPECT_EQ(s["xxh64"], hex64(xxh64(ts[i].bytes.data(), ts[i].bytes.size())));
  }

  // The data file starts with magic and version.
  std::ifstream in(dir + "/" + data_file, std::ios::binary);
  char header[12];
  in.read(header, sizeof header);
  EXPECT_EQ(std::string(header, 8), "LSCKDATA");
  uint32_t version;
  std::memcpy(&version, header + 8, 4);
  EXPECT_EQ(version, 1u);
}

TEST_F(CheckpointTest, RetentionKeepsTheNewest) {
  const auto ts = sample_tensors();
  for (int64_t step = 1; step <= 5; ++step) save(root_, step * 10, refs(ts), json::object(), 2);
  EXPECT_EQ(list_checkpoints(root_),
            (std::vector<std::string>{root_ + "/step_00000040", root_ + "/step_00000050"}));
  EXPECT_EQ(entries_of(root_), (std::vector<std::string>{"step_00000040", "step_00000050"}));

  // keep <= 0 keeps everything.
  save(root_, 60, refs(ts), json::object(), 0);
  save(root_, 70, refs(ts), json::object(), -1);
  EXPECT_EQ(list_checkpoints(root_).size(), 4u);
}

TEST_F(CheckpointTest, RetentionNeverRemovesTheCheckpointJustSaved) {
  // A run resumed from an older step saves below a newer, abandoned checkpoint.
  const auto ts = sample_tensors();
  save(root_, 20, refs(ts), json::object(), 0);
  save(root_, 15, refs(ts), json::object(), 1);
  EXPECT_EQ(list_checkpoints(root_), (std::vector<std::string>{root_ + "/step_00000015"}));
}

TEST_F(CheckpointTest, ListingSortsByStepNotByName) {
  const auto ts = sample_tensors();
  save(root_, 123456789, refs(ts), json::object(), 0);  // 9 digits: longer than the padding
  save(root_, 99999999, refs(ts), json::object(), 0);
  save(root_, 5, refs(ts), json::object(), 0);
  fs::create_directory(root_ + "/step_x");  // not a checkpoint name: ignored
  write_text(root_ + "/step_00000006", "a file, not a directory");
  EXPECT_EQ(list_checkpoints(root_),
            (std::vector<std::string>{root_ + "/step_00000005", root_ + "/step_99999999",
                                      root_ + "/step_123456789"}));
  EXPECT_EQ(load(root_ + "/step_123456789").step, 123456789);
}

TEST_F(CheckpointTest, TruncatedDataFileIsRejectedNamingTheFile) {
  const std::string dir = save(root_, 3, refs(sample_tensors()), json::object(), 0);
  const std::string data = dir + "/tensors-00000.bin";
  fs::resize_file(data, fs::file_size(data) - 10);
  expect_data_error([&] { load(dir); },
                    "step_00000003/tensors-00000\\.bin: truncated: [0-9]+ bytes, manifest expects [0-9]+");
}

TEST_F(CheckpointTest, FlippedByteIsAChecksumMismatchNamingFileAndTensor) {
  const std::string dir = save(root_, 3, refs(sample_tensors()), json::object(), 0);
  const json m = read_json(dir + "/manifest.json");
  flip_byte(dir + "/tensors-00000.bin", m["tensors"][2]["shards"][0]["offset"].get<uint64_t>() + 17);
  expect_data_error([&] { load(dir); },
                    "step_00000003/tensors-00000\\.bin: checksum mismatch in tensor 'optim/m/wte' "
                    "\\(bytes \\[[0-9]+, [0-9]+\\)\\): manifest xxh64 [0-9a-f]{16}, found [0-9a-f]{16}");
}

TEST_F(CheckpointTest, MissingOrMalformedManifestIsRejected) {
  const auto ts = sample_tensors();
  const std::string dir = save(root_, 3, refs(ts), json::object(), 0);
  const std::string path = dir + "/manifest.json";
  const json good = read_json(path);

  fs::remove(path);
  expect_data_error([&] { load(dir); }, "step_00000003/manifest\\.json: missing");

  write_text(path, "{\"format\": \"lockstep-checkpoint\", \"version\": 1,");
  expect_data_error([&] { load(dir); }, "step_00000003/manifest\\.json: malformed JSON");

  write_text(path, "[1, 2]");
  expect_data_error([&] { load(dir); }, "manifest\\.json: malformed manifest: expected a JSON object");

  json m = good;
  m.erase("tensors");
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "manifest\\.json: field 'tensors' missing");

  m = good;
  m["version"] = 3;
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "manifest\\.json: format is 'lockstep-checkpoint' version 3, "
                                        "this build reads 'lockstep-checkpoint' versions 1 to 2");

  m = good;
  m["tensors"][1]["dtype"] = "f12";
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "manifest\\.json: tensor 'model/ln\\.weight': unknown dtype 'f12'");

  m = good;
  m["tensors"][0]["shape"] = {5, 5};
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); },
                    "manifest\\.json: tensor 'model/wte': bytes is 60, but its dtype and shape need 100");

  m = good;
  m["tensors"][0]["shards"][0]["offset"] = 1 << 20;
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "tensors-00000\\.bin: tensor 'model/wte' at bytes \\[1048576, "
                                        "1048636\\) lies outside the file's data");

  m = good;
  m["step"] = 4;
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "manifest\\.json: step is 4 but the directory name says 3");

  m = good;
  m["model_hash"] = "0000000000000000";
  write_text(path, m.dump());
  expect_data_error([&] { load(dir); }, "manifest\\.json: model hash mismatch");

  write_text(path, good.dump());
  EXPECT_EQ(load(dir).step, 3);
}

TEST_F(CheckpointTest, MissingDirectoryOrDataFileIsRejected) {
  expect_data_error([&] { load(root_ + "/step_00000001"); },
                    "step_00000001: no such checkpoint directory");
  const std::string dir = save(root_, 1, refs(sample_tensors()), json::object(), 0);
  fs::remove(dir + "/tensors-00000.bin");
  expect_data_error([&] { load(dir); }, "tensors-00000\\.bin: missing \\(listed in the manifest\\)");
}

TEST_F(CheckpointTest, LoadLatestSkipsACorruptNewestWithOneWarning) {
  const auto ts = sample_tensors();
  for (int64_t step : {1, 2, 3}) save(root_, step, refs(ts), json{{"step", step}}, 0);
  fs::resize_file(root_ + "/step_00000003/tensors-00000.bin", 100);

  std::ostringstream warnings;
  const auto c = load_latest(root_, warnings);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 2);
  EXPECT_EQ(c->state["step"], 2);
  expect_same_tensors(*c, ts);
  const std::string w = warnings.str();
  EXPECT_TRUE(std::regex_match(w, std::regex("warning: skipping checkpoint .*/step_00000003: "
                                             ".*tensors-00000\\.bin: truncated[^\n]*\n")))
      << w;
}

TEST_F(CheckpointTest, LoadLatestOfAnEmptyOrMissingRootIsNothing) {
  std::ostringstream warnings;
  EXPECT_FALSE(load_latest(root_, warnings).has_value());
  fs::create_directories(root_);
  EXPECT_FALSE(load_latest(root_, warnings).has_value());
  EXPECT_EQ(warnings.str(), "");
}

TEST_F(CheckpointTest, CrashLeftoversAreIgnoredByLoadAndCleanedBySave) {
  const auto ts = sample_tensors();
  save(root_, 1, refs(ts), json::object(), 0);
  // A save of step 2 that died after writing part of its files.
  const std::string tmp = root_ + "/.tmp-step_00000002-99999";
  fs::create_directory(tmp);
  write_text(tmp + "/tensors-00000.bin", "LSCKDATA partial");
  write_text(tmp + "/manifest.json", "{\"format\":");
  // A retention delete that died midway.
  fs::create_directory(root_ + "/.del-step_00000000-99999");

  std::ostringstream warnings;
  const auto c = load_latest(root_, warnings);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 1);
  EXPECT_EQ(warnings.str(), "");
  EXPECT_EQ(list_checkpoints(root_), (std::vector<std::string>{root_ + "/step_00000001"}));

  save(root_, 2, refs(ts), json::object(), 0);
  EXPECT_EQ(entries_of(root_), (std::vector<std::string>{"step_00000001", "step_00000002"}));
}

TEST_F(CheckpointTest, ResaveReplacesTheStepAndAnInterruptedResaveIsUndone) {
  auto ts = sample_tensors();
  save(root_, 5, refs(ts), json{{"v", 1}}, 0);
  auto ts2 = ts;
  ts2[0].bytes[0] ^= std::byte{0xFF};
  save(root_, 5, refs(ts2), json{{"v", 2}}, 0);
  Checkpoint c = load(root_ + "/step_00000005");
  EXPECT_EQ(c.state["v"], 2);
  expect_same_tensors(c, ts2);
  EXPECT_EQ(entries_of(root_), (std::vector<std::string>{"step_00000005"}));

  // A re-save that died between moving the old copy aside and renaming the new one in: the next
  // save puts the old copy back.
  fs::rename(root_ + "/step_00000005", root_ + "/.old-step_00000005-99999");
  save(root_, 6, refs(ts), json::object(), 0);
  EXPECT_EQ(entries_of(root_), (std::vector<std::string>{"step_00000005", "step_00000006"}));
  c = load(root_ + "/step_00000005");
  EXPECT_EQ(c.state["v"], 2);

  // One that died after the rename: the old copy is stale and removed.
  fs::create_directory(root_ + "/.old-step_00000006-99999");
  save(root_, 7, refs(ts), json::object(), 0);
  EXPECT_EQ(entries_of(root_),
            (std::vector<std::string>{"step_00000005", "step_00000006", "step_00000007"}));
}

TEST_F(CheckpointTest, SaveRejectsBadArguments) {
  const auto ts = sample_tensors();
  auto dup = refs(ts);
  dup.push_back(dup[0]);
  EXPECT_THROW(save(root_, 1, dup, json::object(), 0), ConfigError);
  EXPECT_THROW(save(root_, 1, refs(ts), json::array(), 0), ConfigError);
  EXPECT_THROW(save(root_, -1, refs(ts), json::object(), 0), ConfigError);
  EXPECT_TRUE(list_checkpoints(root_).empty());
}

TEST_F(CheckpointTest, ModelHashCoversExactlyTheParameters) {
  const auto ts = sample_tensors();
  const uint64_t h = model_hash(refs(ts));
  const Checkpoint a = load(save(root_ + "/a", 1, refs(ts), json{{"x", 1}}, 0));

  // Same parameters, different non-parameter tensors, state and step.
  auto other = ts;
  other[2].bytes[0] ^= std::byte{1};  // optim/m/wte
  other.emplace_back("optim/v/wte", DType::kF32, std::vector<int64_t>{4}, 99);
  const Checkpoint b = load(save(root_ + "/b", 9, refs(other), json{{"x", 2}}, 0));
  EXPECT_EQ(model_hash(a), h);
  EXPECT_EQ(model_hash(b), h);
  EXPECT_EQ(model_hash(refs(other)), h);

  // One bit of one parameter changes it.
  auto flipped = ts;
  flipped[1].bytes[3] ^= std::byte{0x10};  // model/ln.weight
  EXPECT_NE(model_hash(refs(flipped)), h);
  // So does a parameter's name, dtype or shape with the same bytes.
  auto renamed = ts;
  renamed[0].name = "model/wpe";
  EXPECT_NE(model_hash(refs(renamed)), h);
  auto reshaped = ts;
  reshaped[0].shape = {5, 3};
  EXPECT_NE(model_hash(refs(reshaped)), h);
  auto retyped = ts;
  retyped[0].dtype = DType::kI32;
  EXPECT_NE(model_hash(refs(retyped)), h);
}

// The global tensor's element at flat index g, as the shards below hold it.
float element_value(int64_t g) { return 0.5f * static_cast<float>(g) + 1.0f; }

// A tensor's slices along split_dim (ranges), as one row-major tensor, its flat elements [first,
// end): the values a writer of that ShardPlace holds. Computed element by element, independently
// of the loader's runs.
std::vector<float> shard_values(const std::vector<int64_t>& shape, const ShardPlace& p) {
  const auto d = static_cast<size_t>(p.split_dim);
  int64_t inner = 1, along = 0;
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<int64_t> global_of;  // local index along d -> global
  for (const auto& [first, end] : p.ranges)
    for (int64_t x = first; x < end; ++x) global_of.push_back(x);
  along = static_cast<int64_t>(global_of.size());
  std::vector<float> out;
  for (int64_t i = p.first; i < p.end; ++i) {
    const int64_t o = i / (along * inner), l = i / inner % along, j = i % inner;
    out.push_back(element_value((o * shape[d] + global_of[static_cast<size_t>(l)]) * inner + j));
  }
  return out;
}

// Four writers as a dp2 x tp2 ZeRO layout would have them: a (3, 4, 6) tensor cut along dim 1 into
// two tp slices of two segments each (a fused projection's q and k parts), each slice's flat
// elements split between two dp ranks; a (10) tensor written whole by writer 0. load() gives every
// element back in its place; the manifest names every shard and no model hash.
TEST_F(CheckpointTest, ShardedSaveFromSeveralWritersLoadsWholeTensors) {
  const std::vector<int64_t> shape{3, 4, 6}, bias_shape{10};
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> tp_slices = {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}};
  const int64_t slice = 3 * 2 * 6;
  std::vector<std::vector<float>> data;  // kept alive until the writes
  std::vector<ShardPlace> places;
  for (const auto& ranges : tp_slices) {
    for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 13}, {13, slice}}) {
      places.push_back({1, ranges, first, end});
      data.push_back(shard_values(shape, places.back()));
    }
  }
  std::vector<float> bias(10);
  for (int64_t i = 0; i < 10; ++i) bias[static_cast<size_t>(i)] = element_value(i);
  const std::string tmp = begin_save(root_, 5);
  std::vector<json> records;
  for (int w = 0; w < 4; ++w) {
    std::vector<ShardRef> shards = {{"model/w", DType::kF32, shape, places[static_cast<size_t>(w)],
                                     data[static_cast<size_t>(w)].data()}};
    if (w == 0) shards.push_back({"model/b", DType::kF32, bias_shape, ShardPlace{-1, {}, 0, 10}, bias.data()});
    records.push_back(write_shards(tmp, w, shards));
  }
  const std::vector<TensorDesc> tensors = {{"model/w", DType::kF32, shape}, {"model/b", DType::kF32, bias_shape}};
  const std::string dir = finish_save(root_, 5, tmp, tensors, records, json{{"dp", 2}, {"tp", 2}, {"pp", 1}},
                                      json{{"note", "x"}}, "", 0);
  const json m = read_json(dir + "/manifest.json");
  EXPECT_EQ(m["files"].size(), 4u);
  EXPECT_EQ(m["tensors"][0]["shards"].size(), 4u);
  EXPECT_FALSE(m.contains("model_hash"));
  EXPECT_EQ(m["layout"]["tp"], 2);
  const Checkpoint c = load(dir);
  std::vector<float> w(72), b(10);
  c.copy_to("model/w", DType::kF32, shape, w.data());
  c.copy_to("model/b", DType::kF32, bias_shape, b.data());
  for (int64_t g = 0; g < 72; ++g) ASSERT_EQ(w[static_cast<size_t>(g)], element_value(g)) << "element " << g;
  for (int64_t g = 0; g < 10; ++g) ASSERT_EQ(b[static_cast<size_t>(g)], element_value(g)) << "element " << g;

  // A shard left out of the save: the tensor is refused before anything lands.
  const std::string tmp2 = begin_save(root_, 6);
  std::vector<json> short_records = {write_shards(tmp2, 0, {{"model/w", DType::kF32, shape, places[0], data[0].data()}})};
  EXPECT_THROW(finish_save(root_, 6, tmp2, {tensors[0]}, short_records, json::object(), json::object(), "", 0),
               ConfigError);
  EXPECT_EQ(list_checkpoints(root_).size(), 1u);

  // Manifests whose shards overlap or leave a gap: never loaded.
  const std::string path = dir + "/manifest.json";
  json bad = m;
  bad["tensors"][0]["shards"][1]["elements"] = {0, slice - 13};
  write_text(path, bad.dump());
  expect_data_error([&] { load(dir); }, "tensor 'model/w': element [0-9]+ is in two shards");
  bad = m;
  bad["tensors"][0]["shards"][1]["elements"] = {14, slice};
  write_text(path, bad.dump());
  expect_data_error([&] { load(dir); }, "tensor 'model/w' shard 1: bytes is [0-9]+, its [0-9]+ elements need");
  bad = m;
  bad["tensors"][0]["shards"][2]["ranges"] = {{1, 2}, {3, 5}};
  write_text(path, bad.dump());
  expect_data_error([&] { load(dir); }, "tensor 'model/w' shard 2: range \\[3, 5\\) outside dim 1 \\(4\\)");
  bad = m;
  bad["tensors"][0]["shards"].erase(3);
  write_text(path, bad.dump());
  expect_data_error([&] { load(dir); }, "tensor 'model/w': elements \\[[0-9]+, [0-9]+\\) are in no shard");
}

// CheckpointReader reads a part of a tensor — a tp slice's ZeRO piece — reading only the blocks
// that hold it and checking those: a flipped byte in another block goes unseen by this read and is
// found by the read that needs it, and by load().
TEST_F(CheckpointTest, ReaderReadsOnlyTheBlocksItNeedsAndChecksThem) {
  const std::vector<int64_t> shape{700, 1024};  // 2.8 MB: three blocks of one shard
  const ShardPlace whole{-1, {}, 0, 700 * 1024};
  std::vector<float> data(700 * 1024);
  for (size_t g = 0; g < data.size(); ++g) data[g] = element_value(static_cast<int64_t>(g));
  const std::string tmp = begin_save(root_, 9);
  const json record = write_shards(tmp, 0, {{"model/big", DType::kF32, shape, whole, data.data()}});
  const std::string dir = finish_save(root_, 9, tmp, {{"model/big", DType::kF32, shape}}, {record},
                                      json::object(), json{{"note", "x"}}, "", 0);
  ASSERT_EQ(read_json(dir + "/manifest.json")["tensors"][0]["shards"][0]["block_xxh64"].size(), 3u);
  // Columns [512, 1024) of rows 10..19 (a tp slice along dim 1, flat elements of it): in block 0.
  const ShardPlace part{1, {{512, 1024}}, 10 * 512, 20 * 512};
  const std::vector<float> want = shard_values(shape, part);
  {
    CheckpointReader reader(dir);
    EXPECT_EQ(reader.step(), 9);
    EXPECT_EQ(reader.state()["note"], "x");
    std::vector<float> got(want.size());
    reader.read("model/big", DType::kF32, shape, part, got.data());
    EXPECT_EQ(got, want);
    EXPECT_EQ(reader.bytes_read(), kShardBlockBytes);
    EXPECT_THROW(reader.read("model/big", DType::kF32, {700, 512}, part, got.data()), DataError);
  }
  // A byte of block 2 flipped: the part in block 0 still reads, the rows in block 2 do not.
  flip_byte(dir + "/tensors-00000.bin", kDataHeaderBytes + 2 * kShardBlockBytes + 7);
  CheckpointReader reader(dir);
  std::vector<float> got(want.size());
  reader.read("model/big", DType::kF32, shape, part, got.data());
  EXPECT_EQ(got, want);
  const ShardPlace late{1, {{0, 512}}, 600 * 512, 610 * 512};
  std::vector<float> late_got(10 * 512);
  expect_data_error([&] { reader.read("model/big", DType::kF32, shape, late, late_got.data()); },
                    "tensors-00000\\.bin: checksum mismatch in tensor 'model/big' \\(bytes \\[2097216, 2867264\\)\\)");
  expect_data_error([&] { load(dir); }, "tensors-00000\\.bin: checksum mismatch in tensor 'model/big'");
}

// Checkpoints written before sharding (version 1: one whole shard per tensor, given by offsets and
// shape) still load.
TEST_F(CheckpointTest, VersionOneManifestsStillLoad) {
  const auto ts = sample_tensors();
  const std::string dir = save(root_, 3, refs(ts), json::object(), 0);
  json m = read_json(dir + "/manifest.json");
  m["version"] = 1;
  for (json& t : m["tensors"]) {
    json& s = t["shards"][0];
    s.erase("split_dim");
    s.erase("ranges");
    s.erase("elements");
    s["offsets"] = std::vector<int64_t>(t["shape"].size(), 0);
    s["shape"] = t["shape"];
  }
  write_text(dir + "/manifest.json", m.dump());
  const Checkpoint c = load(dir);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(c.tensors[i].bytes, ts[i].bytes) << ts[i].name;
}

TEST(ModelHash, IsTheDocumentedByteSequence) {
  const std::vector<float> w = {1.0f, -2.5f, 0.125f, 3.0f, 4.0f, 5.0f};
  const std::vector<TensorRef> tensors = {{"optim/step", DType::kF32, {1}, w.data()},
                                          {"model/w", DType::kF32, {2, 3}, w.data()}};
  std::string seq;
  auto u64 = [&](uint64_t v) { seq.append(reinterpret_cast<const char*>(&v), 8); };
  u64(7);
  seq += "model/w";
  u64(3);
  seq += "f32";
  u64(2);
  u64(2);
  u64(3);
  u64(24);
  seq.append(reinterpret_cast<const char*>(w.data()), 24);
  EXPECT_EQ(model_hash(tensors), xxh64(seq.data(), seq.size()));
}

// Any list of tensors of any dtype and shape (empty dims included) comes back bit for bit.
RC_GTEST_PROP(CheckpointProperty, RoundTripIsBitwise, ()) {
  const test::TempDir scratch("ls_ckpt_prop_");
  const std::string root = scratch.file("ckpt");
  const std::vector<DType> dtypes = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                     DType::kE4M3, DType::kE5M2, DType::kE8M0, DType::kI32,
                                     DType::kI64,  DType::kU8,   DType::kU16};
  const int n = *rc::gen::inRange(0, 5);
  std::vector<Owned> ts;
  for (int i = 0; i < n; ++i) {
    const DType t = dtypes[*rc::gen::inRange<size_t>(0, dtypes.size())];
    const auto shape = *rc::gen::container<std::vector<int64_t>>(
        static_cast<size_t>(*rc::gen::inRange(0, 4)), rc::gen::inRange<int64_t>(0, 6));
    ts.emplace_back(str_cat(i % 2 ? "model/p" : "optim/q", i), t, shape,
                    *rc::gen::arbitrary<uint32_t>());
  }
  const int64_t step = *rc::gen::inRange<int64_t>(0, 1000000);
  const Checkpoint c = load(save(root, step, refs(ts), json{{"n", n}}, 1));
  RC_ASSERT(c.step == step);
  RC_ASSERT(c.tensors.size() == ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    RC_ASSERT(c.tensors[i].name == ts[i].name);
    RC_ASSERT(c.tensors[i].dtype == ts[i].dtype);
    RC_ASSERT(c.tensors[i].shape == ts[i].shape);
    RC_ASSERT(c.tensors[i].bytes == ts[i].bytes);
  }
  RC_ASSERT(model_hash(c) == model_hash(refs(ts)));
}

}  // namespace
}  // namespace lockstep::ckpt
