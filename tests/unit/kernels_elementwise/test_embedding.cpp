// Embedding kernels: within the Bounded<double> reference's bounds in both modes; canonical
// backward bitwise equal to a scalar rendering of the contract, invariant under thread count and
// under splitting the batch between calls; bad tokens rejected with their position and value.
#include <gtest/gtest.h>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/embedding.hpp"
#include "reference/embedding.hpp"
#include "src/core/check.hpp"
#include "support.hpp"

namespace lockstep::test {
namespace {

struct EmbeddingData {
  EmbeddingShape s;
  std::vector<int32_t> tokens;
  std::vector<float> wte, wpe, dout;
};

EmbeddingData make_embedding_data(EmbeddingShape s, uint32_t seed) {
  EmbeddingData d{s, std::vector<int32_t>(s.B * s.T), random_floats(s.V * s.C, seed, -1.0f, 1.0f),
                  random_floats(s.T * s.C, seed + 1, -1.0f, 1.0f),
                  random_floats(s.B * s.T * s.C, seed + 2, -1.0f, 1.0f)};
  std::mt19937 rng(seed + 3);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(s.V - 1));
  for (auto& t : d.tokens) t = tok(rng);  // small V: many repeats inside a chunk
  return d;
}

struct EmbeddingResult {
  std::vector<float> out, dwte, dwpe;
  std::vector<float> all() const { return concat({&out, &dwte, &dwpe}); }
};

// Forward, then backward split into calls after the given numbers of sequences.
EmbeddingResult run_embedding(Mode mode, const EmbeddingData& d, bool with_wpe,
                              std::vector<int64_t> seq_splits = {}) {
  const auto s = d.s;
  EmbeddingResult r;
  r.out.resize(s.B * s.T * s.C);
  cpu::embedding_forward(mode, s, r.out.data(), d.tokens.data(), d.wte.data(),
                         with_wpe ? d.wpe.data() : nullptr);
  Sink dwte(mode, s.V * s.C), dwpe(mode, s.T * s.C);
  seq_splits.push_back(s.B);
  int64_t b0 = 0;
  for (int64_t b1 : seq_splits) {
    const int64_t n0 = b0 * s.T;
    cpu::embedding_backward(mode, {b1 - b0, s.T, s.C, s.V}, n0, dwte.sink(),
                            with_wpe ? dwpe.sink() : GradSink{}, d.dout.data() + n0 * s.C,
                            d.tokens.data() + n0);
    b0 = b1;
  }
  r.dwte = dwte.values();
  if (with_wpe) r.dwpe = dwpe.values();
  return r;
}

// The contract: per chunk of 64 tokens, per vocabulary row (or position) in increasing order, a
// plain-add chain over the chunk's tokens of that row in increasing token order.
EmbeddingResult embedding_contract(const EmbeddingData& d) {
  const auto s = d.s;
  const int64_t N = s.B * s.T, C = s.C;
  EmbeddingResult r;
  r.out.resize(N * C);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      r.out[n * C + c] = d.wte[d.tokens[n] * C + c] + d.wpe[(n % s.T) * C + c];
    }
  }
  ExactAccumulator dwte(s.V * C), dwpe(s.T * C);
  for (int64_t n0 = 0; n0 < N; n0 += kCanonicalChunk) {
    const int64_t n1 = std::min(n0 + kCanonicalChunk, N);
    for (int64_t v = 0; v < s.V; ++v) {
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        bool any = false;
        for (int64_t n = n0; n < n1; ++n) {
          if (d.tokens[n] != v) continue;
          acc = acc + d.dout[n * C + c];
          any = true;
        }
        if (any) dwte.add(v * C + c, acc);
      }
    }
    for (int64_t t = 0; t < s.T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        bool any = false;
        for (int64_t n = n0; n < n1; ++n) {
          if (n % s.T != t) continue;
          acc = acc + d.dout[n * C + c];
          any = true;
        }
        if (any) dwpe.add(t * C + c, acc);
      }
    }
  }
  r.dwte.resize(s.V * C);
  r.dwpe.resize(s.T * C);
  dwte.round_to(r.dwte.data());
  dwpe.round_to(r.dwpe.data());
  return r;
}

const EmbeddingShape kShapes[] = {
    {1, 1, 1, 1}, {2, 3, 7, 5}, {3, 37, 65, 11}, {5, 32, 13, 3}, {2, 97, 31, 257}};

TEST(Embedding, WithinReferenceBoundsBothModes) {
  uint32_t seed = 1000;
  for (Mode mode : kModes) {
    for (const auto& s : kShapes) {
      for (bool with_wpe : {true, false}) {
        const EmbeddingData d = make_embedding_data(s, seed++);
        const EmbeddingResult k = run_embedding(mode, d, with_wpe);
        const auto wte = to_bounded(d.wte), wpe = to_bounded(d.wpe), dout = to_bounded(d.dout);
        std::vector<Bd> out(s.B * s.T * s.C), dwte(s.V * s.C), dwpe(s.T * s.C);
        reference::embedding_forward<Bd>(s.B, s.T, s.C, s.V, out.data(), d.tokens.data(),
                                         wte.data(), with_wpe ? wpe.data() : nullptr);
        reference::embedding_backward<Bd>(s.B, s.T, s.C, s.V, dwte.data(),
                                          with_wpe ? dwpe.data() : nullptr, dout.data(),
                                          d.tokens.data());
        const std::string what = "embedding " + std::string(mode_name(mode)) + " B=" +
                                 std::to_string(s.B) + " T=" + std::to_string(s.T) +
                                 (with_wpe ? " wpe" : " no wpe");
        expect_within(what + " out", k.out, out);
        expect_within(what + " dwte", k.dwte, dwte);
        if (with_wpe) expect_within(what + " dwpe", k.dwpe, dwpe);
      }
    }
  }
}

TEST(Embedding, CanonicalMatchesContractAndThreadCount) {
  uint32_t seed = 2000;
  for (const auto& s : kShapes) {
    const EmbeddingData d = make_embedding_data(s, seed++);
    const auto got = expect_thread_invariant(
        "embedding canonical", [&] { return run_embedding(Mode::kCanonical, d, true).all(); });
    expect_bitwise("embedding canonical vs contract", got, embedding_contract(d).all());
  }
}

// 5 sequences of 32 tokens: a split after 2 or 4 sequences falls on a chunk boundary (64, 128).
TEST(Embedding, CanonicalTokenSplitMatchesOneCall) {
  const EmbeddingData d = make_embedding_data({5, 32, 19, 7}, 3000);
  const auto one = run_embedding(Mode::kCanonical, d, true).all();
  expect_bitwise("embedding split after 2 sequences",
                 run_embedding(Mode::kCanonical, d, true, {2}).all(), one);
  expect_bitwise("embedding split after 2 and 4 sequences",
                 run_embedding(Mode::kCanonical, d, true, {2, 4}).all(), one);
  // A split after 1 sequence (token 32) would cut a chunk: refused.
  EXPECT_THROW(run_embedding(Mode::kCanonical, d, true, {1}), ConfigError);
}

TEST(Embedding, TokenOutsideVocabularyNamesPositionAndValue) {
  EmbeddingData d = make_embedding_data({2, 3, 4, 5}, 4000);
  std::vector<float> out(2 * 3 * 4);
  for (int32_t bad : {5, -1}) {
    d.tokens[1 * 3 + 2] = bad;
    for (Mode mode : kModes) {
      try {
        cpu::embedding_forward(mode, d.s, out.data(), d.tokens.data(), d.wte.data(), d.wpe.data());
        ADD_FAILURE() << "token " << bad << " accepted";
      } catch (const ConfigError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("b=1, t=2"), std::string::npos) << msg;
        EXPECT_NE(msg.find("is " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("[0, 5)"), std::string::npos) << msg;
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::test
