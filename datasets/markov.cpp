// Sparse Markov chains of order k with an exact entropy rate (see markov.hpp).
#include "datasets/markov.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <utility>

#include "src/core/check.hpp"
#include "src/core/splitmix64.hpp"

namespace lockstep::datasets {

namespace {

constexpr char kSymbolChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
static_assert(sizeof(kSymbolChars) - 1 == kMarkovMaxAlphabet);

constexpr int kMaxAttempts = 64;
// Power iteration stops when successive distributions differ by less than this in L1 norm; the
// entropy rate then carries an error of at most about this times max_c H(P(.|c)) <= log(A).
constexpr double kStationaryTolerance = 1e-14;
constexpr int kMaxPowerIterations = 100000;

int64_t checked_contexts(int order, int alphabet) {
  LS_REQUIRE(order >= 1, "markov: order must be >= 1, got ", order);
  LS_REQUIRE(alphabet >= 2 && alphabet <= kMarkovMaxAlphabet, "markov: alphabet must be in [2, ",
             kMarkovMaxAlphabet, "], got ", alphabet);
  int64_t n = 1;
  for (int i = 0; i < order; ++i) {
    n *= alphabet;
    LS_REQUIRE(n <= kMarkovMaxContexts, "markov: alphabet^order = ", alphabet, "^", order, " exceeds ",
               kMarkovMaxContexts, " contexts");
  }
  return n;
}

double entropy_of(const double* p, int64_t n) {
  double h = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] > 0) h -= p[i] * std::log(p[i]);
  }
  return h;
}

}  // namespace

MarkovChain MarkovChain::generate(const MarkovSpec& spec) {
  const int64_t contexts = checked_contexts(spec.order, spec.alphabet);
  LS_REQUIRE(spec.branch >= 1 && spec.branch <= spec.alphabet, "markov: branch must be in [1, alphabet = ",
             spec.alphabet, "], got ", spec.branch);
  const int64_t A = spec.alphabet, groups = contexts / A;
  SplitMix64 seeds(spec.seed);
  std::string last_problem;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    MarkovChain chain;
    chain.order_ = spec.order;
    chain.alphabet_ = spec.alphabet;
    chain.branch_ = spec.branch;
    chain.num_contexts_ = contexts;
    chain.attempts_ = attempt + 1;
    chain.chain_seed_ = attempt == 0 ? spec.seed : seeds.next();
    chain.successors_.resize(contexts * spec.branch);
    chain.probs_.resize(contexts * spec.branch);
    SplitMix64 rng(chain.chain_seed_);
    std::vector<int32_t> perm(A);
    for (int64_t g = 0; g < groups; ++g) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int64_t i = A - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);  // Fisher-Yates
      for (int64_t s1 = 0; s1 < A; ++s1) {
        const int64_t c = s1 * groups + g;  // s1 is the oldest symbol, g the k-1 newest
        double total = 0;
        for (int j = 0; j < spec.branch; ++j) {
          chain.successors_[c * spec.branch + j] = perm[(s1 * spec.branch + j) % A];
          const double w = 0.0625 + 0.9375 * rng.unit();
          chain.probs_[c * spec.branch + j] = w;
          total += w;
        }
        for (int j = 0; j < spec.branch; ++j) chain.probs_[c * spec.branch + j] /= total;
      }
    }
    last_problem = chain.ergodicity_problem();
    if (last_problem.empty() && chain.solve()) return chain;
    if (last_problem.empty()) last_problem = "power iteration did not converge";
  }
  throw ConfigError(str_cat("markov: no irreducible aperiodic chain with order ", spec.order, ", alphabet ",
                            spec.alphabet, ", branch ", spec.branch, " in ", kMaxAttempts,
                            " attempts from seed ", spec.seed, " (last: ", last_problem,
                            "); increase branch"));
}

MarkovChain::MarkovChain(int order, int alphabet, int branch, std::vector<int32_t> successors,
                         std::vector<double> probs)
    : order_(order),
      alphabet_(alphabet),
      branch_(branch),
      num_contexts_(checked_contexts(order, alphabet)),
      successors_(std::move(successors)),
      probs_(std::move(probs)) {
  LS_REQUIRE(branch >= 1 && branch <= alphabet, "markov: branch must be in [1, alphabet = ", alphabet, "], got ",
             branch);
  const auto cells = static_cast<size_t>(num_contexts_ * branch);
  LS_REQUIRE(successors_.size() == cells && probs_.size() == cells, "markov: successors and probs must have ",
             num_contexts_, " x ", branch, " = ", cells, " entries, got ", successors_.size(), " and ",
             probs_.size());
  for (int64_t c = 0; c < num_contexts_; ++c) {
    double total = 0;
    for (int j = 0; j < branch; ++j) {
      const int32_t s = successor(c, j);
      const double p = prob(c, j);
      LS_REQUIRE(s >= 0 && s < alphabet, "markov: context ", c, " successor ", j, " is ", s, ", expected in [0, ",
                 alphabet, ")");
      for (int i = 0; i < j; ++i) {
        LS_REQUIRE(successor(c, i) != s, "markov: context ", c, " lists successor ", s, " twice");
      }
      LS_REQUIRE(p > 0, "markov: context ", c, " successor ", j, " has probability ", p, ", expected > 0");
      total += p;
    }
    LS_REQUIRE(std::fabs(total - 1) <= 1e-12, "markov: context ", c, " probabilities sum to ", total,
               ", expected 1");
  }
  const std::string problem = ergodicity_problem();
  LS_REQUIRE(problem.empty(), "markov: chain is not usable: ", problem);
  LS_REQUIRE(solve(), "markov: power iteration did not converge in ", kMaxPowerIterations, " iterations");
}

double MarkovChain::prob_of(int64_t context, int32_t symbol) const {
  for (int j = 0; j < branch_; ++j) {
    if (successor(context, j) == symbol) return prob(context, j);
  }
  return 0;
}

int64_t MarkovChain::next_context(int64_t context, int32_t symbol) const {
  return (context * alphabet_ + symbol) % num_contexts_;
}

std::string MarkovChain::ergodicity_problem() const {
  const int64_t n = num_contexts_;
  // Forward and reverse reachability from context 0: strongly connected iff both reach everything.
  std::vector<std::vector<int64_t>> reverse(n);
  for (int64_t c = 0; c < n; ++c) {
    for (int j = 0; j < branch_; ++j) reverse[next_context(c, successor(c, j))].push_back(c);
  }
  std::vector<int64_t> level(n, -1), queue{0};
  level[0] = 0;
  for (size_t q = 0; q < queue.size(); ++q) {
    const int64_t c = queue[q];
    for (int j = 0; j < branch_; ++j) {
      const int64_t d = next_context(c, successor(c, j));
      if (level[d] < 0) {
        level[d] = level[c] + 1;
        queue.push_back(d);
      }
    }
  }
  if (static_cast<int64_t>(queue.size()) != n) {
    return str_cat("reducible: ", n - static_cast<int64_t>(queue.size()), " of ", n,
                   " contexts unreachable from context 0");
  }
  std::vector<char> seen(n, 0);
  queue.assign(1, 0);
  seen[0] = 1;
  for (size_t q = 0; q < queue.size(); ++q) {
    for (int64_t d : reverse[queue[q]]) {
      if (!seen[d]) {
        seen[d] = 1;
        queue.push_back(d);
      }
    }
  }
  if (static_cast<int64_t>(queue.size()) != n) {
    return str_cat("reducible: context 0 unreachable from ", n - static_cast<int64_t>(queue.size()), " of ", n,
                   " contexts");
  }
  // Period = gcd over edges u -> v of level(u) + 1 - level(v), BFS levels from any node.
  int64_t period = 0;
  for (int64_t c = 0; c < n; ++c) {
    for (int j = 0; j < branch_; ++j) {
      const int64_t d = next_context(c, successor(c, j));
      period = std::gcd(period, std::abs(level[c] + 1 - level[d]));
    }
  }
  if (period != 1) return str_cat("periodic with period ", period);
  return "";
}

bool MarkovChain::solve() {
  const int64_t n = num_contexts_;
  std::vector<double> pi(n, 1.0 / static_cast<double>(n)), next(n);
  bool converged = false;
  for (power_iterations_ = 1; power_iterations_ <= kMaxPowerIterations; ++power_iterations_) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t c = 0; c < n; ++c) {
      for (int j = 0; j < branch_; ++j) next[next_context(c, successor(c, j))] += pi[c] * prob(c, j);
    }
    double total = 0, change = 0;
    for (int64_t c = 0; c < n; ++c) total += next[c];
    for (int64_t c = 0; c < n; ++c) {
      next[c] /= total;  // keep the mass at 1 against rounding drift
      change += std::fabs(next[c] - pi[c]);
    }
    pi.swap(next);
    if (change < kStationaryTolerance) {
      converged = true;
      break;
    }
  }
  if (!converged) return false;
  stationary_ = std::move(pi);
  entropy_rate_ = 0;
  for (int64_t c = 0; c < n; ++c) entropy_rate_ += stationary_[c] * entropy_of(&probs_[c * branch_], branch_);
  context_entropy_ = entropy_of(stationary_.data(), n);
  return true;
}

double MarkovChain::optimal_window_loss(int64_t T) const {
  LS_REQUIRE(T >= 1, "markov: window length must be >= 1, got ", T);
  if (T >= order_) {
    return (context_entropy_ + static_cast<double>(T - order_) * entropy_rate_) / static_cast<double>(T);
  }
  // H(X_1..X_T): the marginal of pi on the T oldest symbols of a context.
  int64_t rest = 1;
  for (int64_t i = T; i < order_; ++i) rest *= alphabet_;
  std::vector<double> marginal(num_contexts_ / rest, 0.0);
  for (int64_t c = 0; c < num_contexts_; ++c) marginal[c / rest] += stationary_[c];
  return entropy_of(marginal.data(), static_cast<int64_t>(marginal.size())) / static_cast<double>(T);
}

char MarkovChain::symbol_char(int32_t symbol) {
  LS_CHECK(symbol >= 0 && symbol < kMarkovMaxAlphabet, symbol);
  return kSymbolChars[symbol];
}

int32_t MarkovChain::char_symbol(char c) const {
  for (int32_t s = 0; s < alphabet_; ++s) {
    if (kSymbolChars[s] == c) return s;
  }
  return -1;
}

std::string MarkovChain::sample(int64_t n, uint64_t seed) const {
  LS_REQUIRE(n >= 0, "markov: sample length must be >= 0, got ", n);
  SplitMix64 rng(seed);
  // Initial context ~ pi, by inversion of the cumulative distribution.
  const double u0 = rng.unit();
  int64_t context = num_contexts_ - 1;
  double acc = 0;
  for (int64_t c = 0; c < num_contexts_; ++c) {
    acc += stationary_[c];
    if (u0 < acc) {
      context = c;
      break;
    }
  }
  std::string text;
  text.reserve(static_cast<size_t>(n));
  int64_t digits = context;  // emit the context's symbols, oldest first
  std::string head(static_cast<size_t>(order_), ' ');
  for (int i = order_ - 1; i >= 0; --i) {
    head[i] = symbol_char(static_cast<int32_t>(digits % alphabet_));
    digits /= alphabet_;
  }
  text.append(head, 0, static_cast<size_t>(std::min<int64_t>(n, order_)));
  while (static_cast<int64_t>(text.size()) < n) {
    const double u = rng.unit();
    int j = branch_ - 1;
    double cum = 0;
    for (int i = 0; i < branch_; ++i) {
      cum += prob(context, i);
      if (u < cum) {
        j = i;
        break;
      }
    }
    const int32_t s = successor(context, j);
    text.push_back(symbol_char(s));
    context = next_context(context, s);
  }
  return text;
}

}  // namespace lockstep::datasets
