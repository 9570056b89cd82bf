// Where each token's chosen experts compute it: the rows of the experts' buffer (expert-major,
// each expert's tokens in token order, so that an expert's weight gradient can sum them in global
// token order) and the choices dropped by the capacity.
//
// Capacity (a named policy: "token order"): per group of tokens (a sequence, so that micro-batches
// and data-parallel ranks do not change it), expert e keeps the first `capacity` choices of it in
// token order (a token's choices in rank order); later ones are dropped — their gate counts for
// nothing and the token's residual stream passes that expert by. capacity 0: dropless.
// Not here: the router's choice (kernels/ops/moe.hpp), the experts' products (layers/moe.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

// ceil(factor · group · top_k / experts), or 0 (dropless) for factor 0.
int64_t moe_capacity(double factor, int64_t group, int64_t top_k, int64_t experts);

// The rows of one micro-batch, in buffers sized once for the largest (no allocation per pass).
struct MoeRouting {
  std::vector<int32_t> rows;          // (N, K): the row of choice j of token n, −1 if dropped
  std::vector<int32_t> token_of_row;  // (R)
  std::vector<int64_t> expert_first;  // (E + 1): expert e's rows are [expert_first[e], expert_first[e + 1])
  std::vector<int64_t> routed;        // (E): choices of e, before the capacity
  int64_t R = 0;                      // rows kept

  // Sized for max_tokens tokens (only ever enlarged: recomputed layers share one).
  void size_for(int64_t max_tokens, int64_t K, int64_t E);
  int64_t kept(int64_t e) const { return expert_first[e + 1] - expert_first[e]; }

  // From experts (N, K) (the router's choices): N tokens in groups of `group`.
  void assign(const int32_t* experts, int64_t N, int64_t K, int64_t group, int64_t capacity);

 private:
  std::vector<int64_t> in_group_;  // (E): kept in the current group, then the next free row
};

}  // namespace lockstep
