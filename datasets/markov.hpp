// Synthetic text with a known entropy rate: a sparse Markov chain of order k over an alphabet of A
// printable characters ('a', 'b', ... then 'A'.., '0'..; never whitespace, so that every character
// of the corpus is a symbol of the chain). Context c = the last k symbols, oldest first, as the
// base-A number s1*A^(k-1) + ... + sk; each context has `branch` distinct possible next symbols with
// random probabilities. Everything random comes from SplitMix64 and correctly rounded IEEE
// operations (no libm, no std::*_distribution), so a seed gives the same chain and the same text on
// every machine. Only the reported entropies use std::log.
//
// The entropy rate h = sum_c pi(c) H(P(.|c)) (nats/token) uses the stationary distribution pi over
// the A^k contexts, found by power iteration; generate() only returns chains that are irreducible
// and aperiodic (checked on the transition graph), so pi is unique and the iteration converges.
// A model that sees at least k previous tokens has expected loss h per token; over a window of T
// tokens starting at stationarity the Bayes-optimal expected loss is optimal_window_loss(T).
//
// Not a text corpus and not a tokenizer: it produces characters; datasets are built from them by
// `lockstep data build`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::datasets {

inline constexpr int kMarkovMaxAlphabet = 62;            // a-z A-Z 0-9
inline constexpr int64_t kMarkovMaxContexts = 1 << 22;   // A^k

struct MarkovSpec {
  int order = 2;       // k >= 1
  int alphabet = 16;   // A in [2, kMarkovMaxAlphabet]
  int branch = 4;      // possible next symbols per context, in [1, A]
  uint64_t seed = 1234;
};

class MarkovChain {
 public:
  // A random chain for `spec`. Successors: for every suffix s2..sk, the A contexts s1 s2..sk take
  // consecutive runs of `branch` symbols from one random permutation of the alphabet, so every
  // context has in-degree = out-degree = branch. Probabilities: weights uniform in [1/16, 1),
  // normalised. Chains that are not irreducible and aperiodic are discarded and the next seed of
  // a SplitMix64 stream started at spec.seed is tried (attempts() says how many were drawn).
  // Throws ConfigError for out-of-range parameters or when 64 attempts all fail.
  static MarkovChain generate(const MarkovSpec& spec);

  // An explicit chain: successors and probs are (A^k, branch), row c for context c; each row's
  // successors distinct and in [0, A), probabilities > 0 summing to 1 (within 1e-12). Throws
  // ConfigError otherwise, or if the chain is not irreducible and aperiodic.
  MarkovChain(int order, int alphabet, int branch, std::vector<int32_t> successors, std::vector<double> probs);

  int order() const { return order_; }
  int alphabet() const { return alphabet_; }
  int branch() const { return branch_; }
  int64_t num_contexts() const { return num_contexts_; }
  int attempts() const { return attempts_; }
  uint64_t chain_seed() const { return chain_seed_; }  // the seed of the attempt that was kept

  int32_t successor(int64_t context, int j) const { return successors_[context * branch_ + j]; }
  double prob(int64_t context, int j) const { return probs_[context * branch_ + j]; }
  // P(symbol | context); 0 for a symbol that is not a successor.
  double prob_of(int64_t context, int32_t symbol) const;
  // The context after emitting `symbol` in `context`.
  int64_t next_context(int64_t context, int32_t symbol) const;

  const std::vector<double>& stationary() const { return stationary_; }  // pi, (A^k)
  int power_iterations() const { return power_iterations_; }
  double entropy_rate() const { return entropy_rate_; }               // h, nats/token
  double context_entropy() const { return context_entropy_; }         // H(pi) = H(X_1..X_k), nats
  // Expected loss per token of the Bayes-optimal model over a window of T >= k tokens whose first
  // token is at stationarity and which sees only the window: (H(pi) + (T - k) h) / T, since the
  // conditional entropies of positions 0..k-1 telescope to H(X_1..X_k).
  double optimal_window_loss(int64_t T) const;

  // The symbol's character and back.
  static char symbol_char(int32_t symbol);
  int32_t char_symbol(char c) const;  // -1 if c is not in this alphabet

  // n characters from the chain started at stationarity (the first k symbols are a context drawn
  // from pi), sampled with a SplitMix64 stream seeded by `seed`.
  std::string sample(int64_t n, uint64_t seed) const;

 private:
  MarkovChain() = default;
  // Empty string if irreducible and aperiodic, else the reason.
  std::string ergodicity_problem() const;
  // Fills stationary_, entropy_rate_, context_entropy_; false if the iteration did not converge.
  bool solve();

  int order_ = 0;
  int alphabet_ = 0;
  int branch_ = 0;
  int64_t num_contexts_ = 0;
  int attempts_ = 1;
  uint64_t chain_seed_ = 0;
  std::vector<int32_t> successors_;  // (A^k, branch)
  std::vector<double> probs_;        // (A^k, branch)
  std::vector<double> stationary_;   // (A^k)
  int power_iterations_ = 0;
  double entropy_rate_ = 0;
  double context_entropy_ = 0;
};

}  // namespace lockstep::datasets
