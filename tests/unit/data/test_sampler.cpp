// TrainSampler and EvalReader: the per-epoch permutation is a bijection, samples are pure functions
// of (seed, global index), a saved state resumes identically, and a batch split between ranks
// equals the whole batch.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/temp_dir.hpp"

namespace lockstep::data {
namespace {

using test::config_error;

// A token file whose token at position p is p mod 65536: a window's content names its position.
class PositionFile {
 public:
  explicit PositionFile(int64_t tokens) {
    std::vector<uint16_t> data(static_cast<size_t>(tokens));
    for (int64_t p = 0; p < tokens; ++p) data[p] = static_cast<uint16_t>(p % 65536);
    write_token_file(dir_.file("tokens.bin"), data);
    file_ = std::make_unique<TokenFile>(dir_.file("tokens.bin"));
  }
  const TokenFile& file() const { return *file_; }

 private:
  test::TempDir dir_;
  std::unique_ptr<TokenFile> file_;  // unmapped before dir_ is removed (members die in reverse)
};

struct Batch {
  std::vector<int32_t> inputs, targets;
  Batch(int64_t count, int64_t T) : inputs(count * T), targets(count * T) {}
  bool operator==(const Batch&) const = default;
};

std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = permute_index(i, n, seed, epoch);
  return p;
}

bool is_permutation_of_range(std::vector<int64_t> p) {
  std::sort(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(Permutation, CoversEveryIndexOncePerEpoch) {
  for (int64_t n : {1, 2, 3, 4, 5, 16, 17, 255, 1000, 4097}) {
    for (uint64_t seed : {0ULL, 1ULL, 1234ULL, ~0ULL}) {
      for (uint64_t epoch : {0ULL, 1ULL, 99ULL}) {
        EXPECT_TRUE(is_permutation_of_range(permutation(n, seed, epoch))) << "n " << n << " seed " << seed;
      }
    }
  }
}

RC_GTEST_PROP(Permutation, IsABijection, ()) {
  const auto n = *rc::gen::inRange<int64_t>(1, 5000);
  const auto seed = *rc::gen::arbitrary<uint64_t>();
  const auto epoch = *rc::gen::inRange<uint64_t>(0, 1000);
  RC_ASSERT(is_permutation_of_range(permutation(n, seed, epoch)));
}

TEST(Permutation, DependsOnSeedAndEpoch) {
  const auto base = permutation(1000, 1, 0);
  EXPECT_NE(base, permutation(1000, 2, 0));
  EXPECT_NE(base, permutation(1000, 1, 1));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(base, identity);
}

TEST(Permutation, IsPinnedAcrossVersions) {
  // A checkpoint's sampler state only resumes the same data if the permutation never changes:
  // these values are SplitMix64 + Feistel arithmetic, identical on every machine.
  EXPECT_EQ(permutation(10, 1234, 0), (std::vector<int64_t>{3, 9, 7, 0, 6, 5, 1, 2, 8, 4}));
}

TEST(TrainSampler, SamplesAreWindowsOfTheFile) {
  const int64_t T = 8;
  PositionFile data(1000);  // W = 999 / 8 = 124 windows
  TrainSampler sampler(data.file(), T, 7);
  EXPECT_EQ(sampler.num_windows(), 124);
  const int64_t count = 300;  // crosses into the third epoch
  Batch b(count, T);
  sampler.fill(0, count, b.inputs.data(), b.targets.data());
  for (int64_t s = 0; s < count; ++s) {
    const int64_t w = sampler.window(s);
    ASSERT_TRUE(w >= 0 && w < 124) << w;
    ASSERT_LE(w * T + T, 999);  // the last target is inside the file
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(b.inputs[s * T + t], w * T + t);
      ASSERT_EQ(b.targets[s * T + t], w * T + t + 1);
    }
  }
  // Each epoch visits every window exactly once.
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t s = epoch * 124; s < (epoch + 1) * 124; ++s) seen.push_back(sampler.window(s));
    EXPECT_TRUE(is_permutation_of_range(seen)) << "epoch " << epoch;
  }
}

TEST(TrainSampler, SameSeedAndIndexGiveTheSameSample) {
  const int64_t T = 16;
  PositionFile data(5000);
  TrainSampler a(data.file(), T, 42), b(data.file(), T, 42), c(data.file(), T, 43);
  Batch ba(64, T), bb(64, T), bc(64, T);
  a.fill(1000, 64, ba.inputs.data(), ba.targets.data());
  b.fill(1000, 64, bb.inputs.data(), bb.targets.data());
  c.fill(1000, 64, bc.inputs.data(), bc.targets.data());
  EXPECT_TRUE(ba == bb);
  EXPECT_FALSE(ba == bc);
}

RC_GTEST_PROP(TrainSampler, SplitBetweenRanksEqualsTheWholeBatch, ()) {
  const int64_t T = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t global_batch = *rc::gen::inRange<int64_t>(1, 33);
  const int64_t cut = *rc::gen::inRange<int64_t>(0, global_batch + 1);
  const int64_t steps = *rc::gen::inRange<int64_t>(1, 6);
  PositionFile data(T * 20 + 1);
  TrainSampler whole(data.file(), T, 5), rank0(data.file(), T, 5), rank1(data.file(), T, 5);
  for (int64_t step = 0; step < steps; ++step) {
    Batch all(global_batch, T), part(global_batch, T);
    whole.next_batch(global_batch, 0, global_batch, all.inputs.data(), all.targets.data());
    rank0.next_batch(global_batch, 0, cut, part.inputs.data(), part.targets.data());
    rank1.next_batch(global_batch, cut, global_batch - cut, part.inputs.data() + cut * T,
                     part.targets.data() + cut * T);
    RC_ASSERT(all == part);
  }
  RC_ASSERT(whole.state() == rank0.state());
  RC_ASSERT(whole.state() == rank1.state());
}

TEST(TrainSampler, SavedStateResumesIdentically) {
  const int64_t T = 4, G = 6;
  PositionFile data(401);
  TrainSampler uninterrupted(data.file(), T, 99), first(data.file(), T, 99);
  Batch b(G, T), r(G, T);
  for (int step = 0; step < 7; ++step) {
    uninterrupted.next_batch(G, 0, G, b.inputs.data(), b.targets.data());
    first.next_batch(G, 0, G, r.inputs.data(), r.targets.data());
  }
  const std::string saved = nlohmann::json(first.state()).dump();
  EXPECT_EQ(saved, R"({"next_sample":42,"seed":99})");

  TrainSampler resumed(data.file(), T, 99);
  resumed.restore(nlohmann::json::parse(saved).get<SamplerState>());
  for (int step = 7; step < 40; ++step) {  // crosses epoch boundaries (W = 100)
    uninterrupted.next_batch(G, 0, G, b.inputs.data(), b.targets.data());
    resumed.next_batch(G, 0, G, r.inputs.data(), r.targets.data());
    ASSERT_TRUE(b == r) << "step " << step;
  }
  EXPECT_EQ(resumed.next_sample(), 240);
}

TEST(TrainSampler, RejectsBadState) {
  PositionFile data(100);
  TrainSampler sampler(data.file(), 4, 1);
  EXPECT_TRUE(std::regex_match(config_error([&] { sampler.restore({2, 0}); }),
                               std::regex("sampler state: seed 2 differs from the configured seed 1 \\(.*tokens.bin\\)")));
  EXPECT_TRUE(std::regex_match(
      config_error([] { nlohmann::json::parse(R"({"seed": 1})").get<SamplerState>(); }),
      std::regex("sampler state: field 'next_sample' must be an integer, got .*")));
  EXPECT_TRUE(std::regex_match(
      config_error([] { nlohmann::json::parse(R"({"seed": -1, "next_sample": 0})").get<SamplerState>(); }),
      std::regex("sampler state: field 'seed' must be >= 0, got -1")));
}

TEST(TrainSampler, RejectsFileWithoutAWindow) {
  PositionFile data(8);
  try {
    TrainSampler sampler(data.file(), 8, 1);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_TRUE(std::regex_match(std::string(e.what()),
                                 std::regex(".*tokens.bin: too short: 8 tokens hold no window of seq_len \\+ 1 = 9 tokens")))
        << e.what();
  }
  EXPECT_NO_THROW(TrainSampler(data.file(), 7, 1));
}

TEST(EvalReader, ReadsWindowsInOrderAndWraps) {
  const int64_t T = 5;
  PositionFile data(23);  // W = 22 / 5 = 4 windows
  EvalReader reader(data.file(), T);
  EXPECT_EQ(reader.num_windows(), 4);
  Batch b(10, T);
  reader.fill(0, 10, b.inputs.data(), b.targets.data());
  for (int64_t s = 0; s < 10; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(b.inputs[s * T + t], (s % 4) * T + t);
      ASSERT_EQ(b.targets[s * T + t], (s % 4) * T + t + 1);
    }
  }
  // A rank's part of an evaluation batch is the same slice of the whole.
  Batch part(3, T);
  reader.fill(6, 3, part.inputs.data(), part.targets.data());
  EXPECT_TRUE(std::equal(part.inputs.begin(), part.inputs.end(), b.inputs.begin() + 6 * T));
}

}  // namespace
}  // namespace lockstep::data
