// Training sampler and evaluation reader over a TokenFile, both deterministic by construction.
//
// Windows: a file of N tokens holds W = (N - 1) / T non-overlapping windows of T + 1 tokens, window w
// starting at token w*T (window w's last token is window w+1's first). A sample is one window:
// inputs = its first T tokens, targets = its last T.
//
// Training: global sample i (i = step * global_batch + index within the step's global batch) is
// window perm(seed, e)(i mod W) with epoch e = i / W, where perm is a keyed bijection of [0, W)
// (a 6-round Feistel network on the smallest even-bit power of two >= W, cycle-walked into [0, W)).
// A sample is thus a pure function of (file, T, seed, i): a data-parallel rank fills only its part
// of the global batch and the global batch is the same for every layout and every restart.
// Resumable state is {seed, next global sample}.
//
// Evaluation: sample j is window j mod W, in file order, no shuffle — the first `batches * B`
// windows of the validation file, wrapping around when the file is short.
//
// Both keep a pointer to the TokenFile, which must outlive them.
// Not a loader thread: no prefetch, no pinned memory, no device copies — the caller owns buffers.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "src/data/token_file.hpp"

namespace lockstep::data {

// The bijection of [0, n) used for epoch `epoch` under `seed`. Exposed for tests.
int64_t permute_index(int64_t index, int64_t n, uint64_t seed, uint64_t epoch);

struct SamplerState {
  uint64_t seed = 0;
  int64_t next_sample = 0;  // the first global sample of the next step
  bool operator==(const SamplerState&) const = default;
};

// {"seed": u64, "next_sample": i64}. from_json throws ConfigError naming a missing or bad field.
void to_json(nlohmann::json& j, const SamplerState& s);
void from_json(const nlohmann::json& j, SamplerState& s);

class TrainSampler {
 public:
  // Throws DataError if the file holds no window (fewer than seq_len + 1 tokens).
  TrainSampler(const TokenFile& file, int64_t seq_len, uint64_t seed);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_windows() const { return num_windows_; }
  uint64_t seed() const { return state_.seed; }

  // The window read by global sample i (i >= 0).
  int64_t window(int64_t sample) const;

  // Global samples [first_sample, first_sample + count):
  //   inputs  (count, T)  inputs[s*T + t]  = file[window(first_sample + s)*T + t]
  //   targets (count, T)  targets[s*T + t] = file[window(first_sample + s)*T + t + 1]
  void fill(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets) const;

  // The cursor. next_batch fills the samples [next + offset, next + offset + count) of the next
  // global batch (offset, count: this rank's part of it) and advances next by global_batch.
  int64_t next_sample() const { return state_.next_sample; }
  void next_batch(int64_t global_batch, int64_t offset, int64_t count, int32_t* inputs, int32_t* targets);
  SamplerState state() const { return state_; }
  // Throws ConfigError if state.seed differs from this sampler's seed or next_sample < 0.
  void restore(const SamplerState& state);

 private:
  const TokenFile* file_;
  int64_t seq_len_;
  int64_t num_windows_;
  SamplerState state_;
};

class EvalReader {
 public:
  // Throws DataError if the file holds no window (fewer than seq_len + 1 tokens).
  EvalReader(const TokenFile& file, int64_t seq_len);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_windows() const { return num_windows_; }

  // Evaluation samples [first_sample, first_sample + count), sample j being window j mod W; the
  // same layout as TrainSampler::fill. Batch b of size B is samples [b*B, (b+1)*B).
  void fill(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenFile* file_;
  int64_t seq_len_;
  int64_t num_windows_;
};

}  // namespace lockstep::data
