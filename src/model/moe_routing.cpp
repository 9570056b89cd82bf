#include "src/model/moe_routing.hpp"

#include <algorithm>
#include <cmath>

#include "src/core/check.hpp"

namespace lockstep {

int64_t moe_capacity(double factor, int64_t group, int64_t top_k, int64_t experts) {
  if (factor == 0) return 0;
  return static_cast<int64_t>(std::ceil(factor * static_cast<double>(group * top_k) / static_cast<double>(experts)));
}

void MoeRouting::size_for(int64_t max_tokens, int64_t K, int64_t E, int64_t max_routed) {
  const auto n = static_cast<size_t>(max_tokens * K);
  if (rows.size() < n) rows.resize(n);
  if (token_of_row.size() < n) token_of_row.resize(n);
  if (keep_.size() < static_cast<size_t>(max_routed * K)) keep_.resize(static_cast<size_t>(max_routed * K));
  expert_first.resize(static_cast<size_t>(E + 1));
  routed.resize(static_cast<size_t>(E));
  in_group_.resize(static_cast<size_t>(E));
}

void MoeRouting::assign(const int32_t* experts, int64_t N, int64_t K, int64_t group, int64_t capacity,
                        const int32_t* local) {
  const auto E = static_cast<int64_t>(routed.size());
  LS_CHECK(N * K <= static_cast<int64_t>(keep_.size()) && group >= 1 && N % group == 0, "MoE routing of ", N,
           " tokens in groups of ", group);
  const auto here = [&](int64_t n) -> int64_t { return local == nullptr ? n : local[n]; };
  std::fill(routed.begin(), routed.end(), 0);
  std::fill(expert_first.begin(), expert_first.end(), 0);
  // Every choice within the capacity is kept; each expert's kept count here in expert_first[e + 1].
  for (int64_t g0 = 0; g0 < N; g0 += group) {
    std::fill(in_group_.begin(), in_group_.end(), 0);
    for (int64_t i = g0 * K; i < (g0 + group) * K; ++i) {
      const int32_t e = experts[i];
      LS_CHECK(e >= 0 && e < E, "expert ", e, " of ", E);
      const bool keep = capacity == 0 || in_group_[e] < capacity;
      keep_[i] = keep ? 1 : 0;
      in_group_[e] += keep ? 1 : 0;
      if (here(i / K) < 0) continue;
      ++routed[e];
      expert_first[e + 1] += keep ? 1 : 0;
    }
  }
  for (int64_t e = 0; e < E; ++e) expert_first[e + 1] += expert_first[e];
  R = expert_first[E];
  LS_CHECK(R <= static_cast<int64_t>(token_of_row.size()), "MoE routing: ", R, " rows here");
  // Rows in token order within each expert.
  std::copy(expert_first.begin(), expert_first.end() - 1, in_group_.begin());
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t n = here(i / K);
    if (n < 0) continue;
    const int64_t at = n * K + i % K;
    if (keep_[i] == 0) {
      rows[at] = -1;
      continue;
    }
    const int64_t r = in_group_[experts[i]]++;
    rows[at] = static_cast<int32_t>(r);
    token_of_row[r] = static_cast<int32_t>(n);
  }
}

void ExpertRows::plan_sends(const MoeRouting& r) {
  LS_CHECK(static_cast<int64_t>(r.routed.size()) == peers * experts, "expert rows: ", r.routed.size(), " experts over ",
           peers, " peers of ", experts);
  send_rows.assign(static_cast<size_t>(peers), 0);
  send_counts.resize(static_cast<size_t>(peers * experts));
  for (int64_t e = 0; e < peers * experts; ++e) {
    send_counts[e] = r.kept(e);
    send_rows[e / experts] += r.kept(e);
  }
  recv_counts.resize(send_counts.size());
}

void ExpertRows::plan_receives() {
  recv_rows.assign(static_cast<size_t>(peers), 0);
  expert_first.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t q = 0; q < peers; ++q) {
    for (int64_t k = 0; k < experts; ++k) {
      recv_rows[q] += recv_counts[q * experts + k];
      expert_first[k + 1] += recv_counts[q * experts + k];
    }
  }
  for (int64_t k = 0; k < experts; ++k) expert_first[k + 1] += expert_first[k];
  rows = expert_first[experts];
  if (static_cast<int64_t>(received_row.size()) < rows) received_row.resize(static_cast<size_t>(rows));
  if (static_cast<int64_t>(token.size()) < rows) token.resize(static_cast<size_t>(rows));
  // Received rows come peer by peer, each peer's expert by expert: walk them in that order and
  // place each at its expert's next free row.
  next_.assign(expert_first.begin(), expert_first.end() - 1);
  int64_t from = 0;
  for (int64_t q = 0; q < peers; ++q) {
    for (int64_t k = 0; k < experts; ++k) {
      for (int64_t j = 0; j < recv_counts[q * experts + k]; ++j) received_row[next_[k]++] = from++;
    }
  }
}

void ExpertRows::order_tokens() {
  for (int64_t i = 0; i < rows; ++i) token[i] = received_tokens[received_row[i]];
}

void ExpertRows::to_expert_major(const float* received, float* out, int64_t width) const {
  for (int64_t i = 0; i < rows; ++i) std::copy_n(received + received_row[i] * width, width, out + i * width);
}

void ExpertRows::to_received_order(const float* rows_in, float* out, int64_t width) const {
  for (int64_t i = 0; i < rows; ++i) std::copy_n(rows_in + i * width, width, out + received_row[i] * width);
}

}  // namespace lockstep
