// Where each token's chosen experts compute it: the rows of the experts' buffer (expert-major,
// each expert's tokens in token order, so that an expert's weight gradient can sum them in global
// token order) and the choices dropped by the capacity.
//
// Capacity (a named policy: "token order"): per group of tokens (a sequence, so that micro-batches
// and data-parallel ranks do not change it), expert e keeps the first `capacity` choices of it in
// token order (a token's choices in rank order); later ones are dropped — their gate counts for
// nothing and the token's residual stream passes that expert by. capacity 0: dropless.
//
// Context parallelism: a rank holds some positions of each sequence, but the capacity counts every
// choice of the sequence in position order, so every cp rank routes the whole micro-batch (its
// choices gathered) and gives rows to its own tokens only (assign's `local`).
//
// Expert parallelism (ExpertRows): the rows a rank's experts compute come from every ep peer —
// received peer by peer (each peer's rows of the rank's first expert, then its second, ...) and
// computed expert by expert (expert k: peer 0's rows of it, then peer 1's, ...; each peer's in its
// token order). The peers are data ranks in order, whose tokens follow one another in the step's
// batch, so an expert's rows are in global token order as on one process.
// Not here: the router's choice (kernels/ops/moe.hpp), the experts' products (layers/moe.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

// ceil(factor · group · top_k / experts), or 0 (dropless) for factor 0.
int64_t moe_capacity(double factor, int64_t group, int64_t top_k, int64_t experts);

// The rows of one micro-batch, in buffers sized once for the largest (no allocation per pass).
struct MoeRouting {
  std::vector<int32_t> rows;          // (tokens here, K): the row of choice j of token n, −1 if dropped
  std::vector<int32_t> token_of_row;  // (R): the token here
  std::vector<int64_t> expert_first;  // (E + 1): expert e's rows are [expert_first[e], expert_first[e + 1])
  std::vector<int64_t> routed;        // (E): choices of e by the tokens here, before the capacity
  int64_t R = 0;                      // rows kept

  // Sized for max_tokens tokens here and max_routed routed (only ever enlarged: recomputed layers
  // share one).
  void size_for(int64_t max_tokens, int64_t K, int64_t E, int64_t max_routed);
  int64_t kept(int64_t e) const { return expert_first[e + 1] - expert_first[e]; }

  // From experts (N, K) (the router's choices): N tokens in groups of `group`. local (N): each
  // token's index among the tokens here, −1 for another rank's (nullptr: all are here, in order);
  // each expert's rows are in the order of the N tokens.
  void assign(const int32_t* experts, int64_t N, int64_t K, int64_t group, int64_t capacity,
              const int32_t* local = nullptr);

 private:
  std::vector<int64_t> in_group_;  // (E): kept in the current group, then the next free row
  std::vector<uint8_t> keep_;      // (N, K): within the capacity
};

// One micro-batch's rows of this rank's experts under expert parallelism (sized on demand: vectors
// only grow).
struct ExpertRows {
  int64_t peers = 1, experts = 0;               // ep ranks, experts held by each
  std::vector<int64_t> send_rows, recv_rows;    // (peers): rows to and from each peer
  std::vector<int64_t> send_counts, recv_counts;  // (peers · experts): of each expert, to / from each peer
  std::vector<int64_t> expert_first;            // (experts + 1): expert k's rows [first[k], first[k + 1])
  std::vector<int64_t> received_tokens;         // global token index of each row as received
  std::vector<int64_t> token;                   // (rows) of each expert-major row
  std::vector<int64_t> received_row;            // (rows) expert-major row i is received row received_row[i]
  int64_t rows = 0;

  // The sends of routing r over peers · experts experts (peer q holds [q·experts, (q+1)·experts)).
  void plan_sends(const MoeRouting& r);
  // Once recv_counts are in: recv_rows, expert_first, rows and the expert-major order.
  void plan_receives();
  // Once received_tokens are in: token.
  void order_tokens();
  // Received rows (width values each) in expert-major order, and back.
  void to_expert_major(const float* received, float* out, int64_t width) const;
  void to_received_order(const float* rows_in, float* out, int64_t width) const;

 private:
  std::vector<int64_t> next_;  // plan_receives: each expert's next free row
};

}  // namespace lockstep
