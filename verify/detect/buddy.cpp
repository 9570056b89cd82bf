#include "verify/detect/buddy.hpp"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>

#include "src/core/check.hpp"
#include "verify/detect/checksum.hpp"
#include "verify/detect/finding.hpp"

namespace lockstep::detect {

void TensorWitness::start() {
  collecting_ = true;
  hashes_.clear();
  names_.clear();
}

void TensorWitness::observe(std::string_view name, const TensorView& t) {
  if (!collecting_) return;
  LS_CHECK(t.is_contiguous(), "the witness hashes contiguous tensors; ", name, " is not");
  hashes_.push_back(block_hash(t.data, static_cast<size_t>(t.numel()) * dtype_size(t.dtype)));
  names_.emplace_back(name);
}

std::vector<uint64_t> TensorWitness::stop() {
  collecting_ = false;
  return hashes_;
}

const std::string& TensorWitness::name(size_t i) const {
  LS_CHECK(i < names_.size(), "witness tensor ", i, " of ", names_.size());
  return names_[i];
}

namespace {

constexpr size_t kSame = std::numeric_limits<size_t>::max();

// The first index where a and b differ (a longer witness differs where the shorter ends); kSame.
size_t first_difference(std::span<const uint64_t> a, std::span<const uint64_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return ia == a.end() && ib == b.end() ? kSame : static_cast<size_t>(ia - a.begin());
}

class Layout {
 public:
  explicit Layout(const BuddyRuns& r) : dp_(r.dp), tp_(r.tp) {
    LS_CHECK(r.dp >= 2 && r.tp >= 1, "buddy replay needs dp >= 2 (dp ", r.dp, ", tp ", r.tp, ")");
    LS_CHECK(static_cast<int64_t>(r.original.size()) == r.dp * r.tp && r.buddy.size() == r.original.size(),
             "buddy witnesses of ", r.original.size(), " and ", r.buddy.size(), " ranks for dp ", r.dp, " x tp ", r.tp);
  }
  int rank(int64_t d, int64_t t) const { return static_cast<int>(d * tp_ + t); }
  int64_t next(int64_t d) const { return (d + 1) % dp_; }
  int64_t prev(int64_t d) const { return (d + dp_ - 1) % dp_; }
  int64_t dp() const { return dp_; }
  int64_t tp() const { return tp_; }

 private:
  int64_t dp_, tp_;
};

// (rank, first index at which its computation differs from the one it is held against).
using Differences = std::vector<std::pair<int, size_t>>;

// The ranks that differ first (a fault reaches the rest of a tp group through a later collective).
std::pair<std::vector<int>, size_t> first_to_differ(const Differences& d) {
  size_t first = kSame;
  for (const auto& [rank, at] : d) first = std::min(first, at);
  std::vector<int> ranks;
  for (const auto& [rank, at] : d) {
    if (at == first && first != kSame && std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) {
      ranks.push_back(rank);
    }
  }
  return {ranks, first};
}

bool all_equal(const Layout& L, int64_t d, const std::vector<std::vector<uint64_t>>& x,
               const std::vector<std::vector<uint64_t>>& y, int64_t y_group) {
  for (int64_t t = 0; t < L.tp(); ++t) {
    if (first_difference(x[L.rank(d, t)], y[L.rank(y_group, t)]) != kSame) return false;
  }
  return true;
}

std::string groups_text(const std::vector<int64_t>& groups) {
  std::vector<int> g(groups.begin(), groups.end());
  return ranks_text(g);
}

}  // namespace

std::vector<int64_t> disagreeing_batches(const BuddyRuns& runs) {
  const Layout L(runs);
  std::vector<int64_t> bad;
  for (int64_t d = 0; d < L.dp(); ++d) {
    if (!all_equal(L, d, runs.original, runs.buddy, L.next(d))) bad.push_back(d);
  }
  return bad;
}

BuddyVerdict judge_buddies(const BuddyRuns& runs) {
  const Layout L(runs);
  BuddyVerdict v;
  const std::vector<int64_t> bad = disagreeing_batches(runs);
  if (bad.empty()) return v;
  LS_CHECK(runs.third.size() == runs.original.size(), "buddy replay: batches disagree and no third run to judge");
  const auto& A = runs.original;
  const auto& B = runs.buddy;
  const auto& C = runs.third;
  std::vector<int64_t> hit_once, reproducible, irreproducible;
  for (int64_t d : bad) {
    if (all_equal(L, d, C, A, d)) {
      reproducible.push_back(d);
    } else if (all_equal(L, d, C, B, L.next(d))) {
      hit_once.push_back(d);
    } else {
      irreproducible.push_back(d);
    }
  }
  const auto in = [](const std::vector<int64_t>& s, int64_t d) { return std::find(s.begin(), s.end(), d) != s.end(); };
  // A persistently faulty group spoils its own batch and the one it computes as a buddy.
  std::vector<int64_t> suspects;
  for (int64_t x = 0; x < L.dp(); ++x) {
    if (in(reproducible, x) && in(reproducible, L.prev(x))) suspects.push_back(x);
  }
  size_t first_tensor = kSame;
  auto name = [&](const Differences& d) {
    const auto [ranks, first] = first_to_differ(d);
    v.ranks.insert(v.ranks.end(), ranks.begin(), ranks.end());
    first_tensor = std::min(first_tensor, first);
    v.tensor = first_tensor;
  };
  if (!suspects.empty() || !irreproducible.empty()) {
    v.kind = BuddyVerdict::Kind::kPersistent;
    for (int64_t x : suspects) {
      Differences d;
      for (int64_t t = 0; t < L.tp(); ++t) {
        d.emplace_back(L.rank(x, t), first_difference(A[L.rank(x, t)], B[L.rank(L.next(x), t)]));
        d.emplace_back(L.rank(x, t), first_difference(B[L.rank(x, t)], A[L.rank(L.prev(x), t)]));
      }
      name(d);
    }
    for (int64_t g : irreproducible) {
      Differences d;
      for (int64_t t = 0; t < L.tp(); ++t) d.emplace_back(L.rank(g, t), first_difference(A[L.rank(g, t)], C[L.rank(g, t)]));
      name(d);
    }
    v.pinned = !(L.dp() == 2 && !suspects.empty());
    std::string detail;
    if (!suspects.empty()) {
      detail = v.pinned ? str_cat("dp group ", groups_text(suspects),
                                  " computed its own batch and its buddy's differently from the other groups, in "
                                  "every run")
                        : std::string("the two dp groups disagree on both batches in every run: one of them is "
                                      "faulty, and with dp = 2 there is no third replica to say which");
    }
    if (!irreproducible.empty()) {
      detail += str_cat(detail.empty() ? "" : "; ", "dp group ", groups_text(irreproducible),
                        " computed its batch three ways in three runs");
    }
    v.detail = detail;
    std::sort(v.ranks.begin(), v.ranks.end());
    return v;
  }
  if (!hit_once.empty()) {
    v.kind = BuddyVerdict::Kind::kOriginalHit;
    for (int64_t g : hit_once) {
      Differences d;
      for (int64_t t = 0; t < L.tp(); ++t) d.emplace_back(L.rank(g, t), first_difference(A[L.rank(g, t)], C[L.rank(g, t)]));
      name(d);
    }
    v.detail = str_cat("the step's own run of the batch of dp group ", groups_text(hit_once),
                       " differs from its buddy's and from a third run, which agree (the state is now the third run's)");
  } else {
    v.kind = BuddyVerdict::Kind::kBuddyHit;
    std::vector<int64_t> buddies;
    for (int64_t g : reproducible) {
      buddies.push_back(L.next(g));
      Differences d;
      for (int64_t t = 0; t < L.tp(); ++t) {
        d.emplace_back(L.rank(L.next(g), t), first_difference(B[L.rank(L.next(g), t)], A[L.rank(g, t)]));
      }
      name(d);
    }
    v.detail = str_cat("dp group ", groups_text(buddies),
                       " computed its buddy's batch wrongly once; the step's own runs agree (the state is theirs)");
  }
  std::sort(v.ranks.begin(), v.ranks.end());
  return v;
}

}  // namespace lockstep::detect
