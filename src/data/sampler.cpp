// TrainSampler and EvalReader (see sampler.hpp).
#include "src/data/sampler.hpp"

#include <bit>

#include "src/core/check.hpp"
#include "src/core/splitmix64.hpp"

namespace lockstep::data {

namespace {

constexpr int kFeistelRounds = 6;

int64_t count_windows(const TokenFile& file, int64_t seq_len) {
  LS_REQUIRE(seq_len >= 1, "seq_len must be >= 1, got ", seq_len);
  const int64_t windows = file.size() > 0 ? (file.size() - 1) / seq_len : 0;
  if (windows < 1) {
    throw DataError(str_cat(file.path(), ": too short: ", file.size(), " tokens hold no window of seq_len + 1 = ",
                            seq_len + 1, " tokens"));
  }
  return windows;
}

// One window: T inputs and the T targets shifted by one.
void copy_window(const TokenFile& file, int64_t window, int64_t seq_len, int32_t* inputs, int32_t* targets) {
  const uint16_t* src = file.tokens().data() + window * seq_len;
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[t] = src[t];
    targets[t] = src[t + 1];
  }
}

}  // namespace

int64_t permute_index(int64_t index, int64_t n, uint64_t seed, uint64_t epoch) {
  LS_CHECK(n >= 1 && index >= 0 && index < n, "index ", index, " n ", n);
  if (n == 1) return 0;
  // Domain 2^(2h) >= n with h-bit halves, h >= 1. At most 4n, so cycle walking takes < 4 rounds of
  // the network on average.
  const int bits = std::bit_width(static_cast<uint64_t>(n - 1));
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t keys[kFeistelRounds];
  const uint64_t base = splitmix64_mix(seed ^ splitmix64_mix(epoch + 0x6a09e667f3bcc909ULL));
  for (int r = 0; r < kFeistelRounds; ++r) keys[r] = splitmix64_mix(base + static_cast<uint64_t>(r));
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (int r = 0; r < kFeistelRounds; ++r) {
      const uint64_t f = splitmix64_mix(right ^ keys[r]) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

void to_json(nlohmann::json& j, const SamplerState& s) {
  j = nlohmann::json{{"seed", s.seed}, {"next_sample", s.next_sample}};
}

void from_json(const nlohmann::json& j, SamplerState& s) {
  LS_REQUIRE(j.is_object(), "sampler state: expected a JSON object, got ", j.dump());
  LS_REQUIRE(j.contains("seed") && j["seed"].is_number_integer(),
             "sampler state: field 'seed' must be an unsigned integer, got ", j.dump());
  LS_REQUIRE(j.contains("next_sample") && j["next_sample"].is_number_integer(),
             "sampler state: field 'next_sample' must be an integer, got ", j.dump());
  LS_REQUIRE(j["seed"].is_number_unsigned(), "sampler state: field 'seed' must be >= 0, got ", j["seed"].dump());
  s.seed = j["seed"].get<uint64_t>();
  s.next_sample = j["next_sample"].get<int64_t>();
  LS_REQUIRE(s.next_sample >= 0, "sampler state: field 'next_sample' must be >= 0, got ", s.next_sample);
}

TrainSampler::TrainSampler(const TokenFile& file, int64_t seq_len, uint64_t seed)
    : file_(&file), seq_len_(seq_len), num_windows_(count_windows(file, seq_len)), state_{seed, 0} {}

int64_t TrainSampler::window(int64_t sample) const {
  LS_CHECK(sample >= 0, sample);
  const int64_t epoch = sample / num_windows_;
  return permute_index(sample % num_windows_, num_windows_, state_.seed, static_cast<uint64_t>(epoch));
}

void TrainSampler::fill(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets) const {
  LS_CHECK(first_sample >= 0 && count >= 0, first_sample, " ", count);
  for (int64_t s = 0; s < count; ++s) {
    copy_window(*file_, window(first_sample + s), seq_len_, inputs + s * seq_len_, targets + s * seq_len_);
  }
}

void TrainSampler::next_batch(int64_t global_batch, int64_t offset, int64_t count, int32_t* inputs,
                              int32_t* targets) {
  LS_CHECK(global_batch >= 1 && offset >= 0 && count >= 0 && offset + count <= global_batch, "global_batch ",
           global_batch, " offset ", offset, " count ", count);
  fill(state_.next_sample + offset, count, inputs, targets);
  state_.next_sample += global_batch;
}

void TrainSampler::restore(const SamplerState& state) {
  LS_REQUIRE(state.seed == state_.seed, "sampler state: seed ", state.seed, " differs from the configured seed ",
             state_.seed, " (", file_->path(), ")");
  LS_REQUIRE(state.next_sample >= 0, "sampler state: next_sample must be >= 0, got ", state.next_sample);
  state_ = state;
}

EvalReader::EvalReader(const TokenFile& file, int64_t seq_len)
    : file_(&file), seq_len_(seq_len), num_windows_(count_windows(file, seq_len)) {}

void EvalReader::fill(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets) const {
  LS_CHECK(first_sample >= 0 && count >= 0, first_sample, " ", count);
  for (int64_t s = 0; s < count; ++s) {
    copy_window(*file_, (first_sample + s) % num_windows_, seq_len_, inputs + s * seq_len_, targets + s * seq_len_);
  }
}

}  // namespace lockstep::data
