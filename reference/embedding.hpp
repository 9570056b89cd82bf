// Reference token and position embedding, templated on the scalar type (double, MPFR, Bounded<T>).
//
// Mirrors kernels/ops/embedding.hpp in plain single-threaded loops: forward out = wte[token] +
// wpe[t]; backward accumulates (+=) dout into the rows of dwte and dwpe, each element's sum over
// its tokens taken through reference::grad_sum_at with the tokens' global indices (the call holds
// the step's whole batch, token 0 first), so a Bounded<T> instantiation carries the order-free
// bound that covers canonical chunking and fast mode alike, and CanonicalF32 chunks by ⌊n/64⌋.
// Not here: token validation (the kernels' job; tokens here must lie in [0, V)).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "reference/reduce.hpp"

namespace lockstep::reference {

template <class Real>
void embedding_forward(int64_t B, int64_t T, int64_t C, int64_t V,
                       Real* out,                                 // (B, T, C)
                       const int32_t* tokens,                     // (B, T)
                       const Real* wte,                           // (V, C)
                       const Real* wpe) {                         // (T, C) or nullptr
  for (int64_t n = 0; n < B * T; ++n) {
    const Real* e = wte + static_cast<int64_t>(tokens[n]) * C;
    for (int64_t c = 0; c < C; ++c) {
      out[n * C + c] = wpe == nullptr ? e[c] : e[c] + wpe[(n % T) * C + c];
    }
  }
}

// dwte[v,c] += Σ_{n: tokens[n]==v} dout[n,c];  dwpe[t,c] += Σ_{n: n%T==t} dout[n,c].
template <class Real>
void embedding_backward(int64_t B, int64_t T, int64_t C, int64_t V,
                        std::type_identity_t<GradOut<Real>> dwte,  // (V, C) +=
                        std::type_identity_t<GradOut<Real>> dwpe,  // (T, C) += or nullptr
                        const Real* dout,                         // (B, T, C)
                        const int32_t* tokens) {                  // (B, T)
  const int64_t N = B * T;
  std::vector<std::vector<int64_t>> uses(static_cast<size_t>(V));  // tokens of each row
  for (int64_t n = 0; n < N; ++n) uses[static_cast<size_t>(tokens[n])].push_back(n);
  std::vector<Real> terms;
  for (int64_t v = 0; v < V; ++v) {
    const auto& ns = uses[static_cast<size_t>(v)];
    if (ns.empty()) continue;
    for (int64_t c = 0; c < C; ++c) {
      terms.clear();
      for (int64_t n : ns) terms.push_back(dout[n * C + c]);
      grad_sum_at(dwte, v * C + c, ns.data(), terms.data(), static_cast<int64_t>(terms.size()));
    }
  }
  if (!dwpe) return;
  std::vector<int64_t> at(static_cast<size_t>(B));  // tokens t, t+T, ...
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) at[b] = b * T + t;
    for (int64_t c = 0; c < C; ++c) {
      terms.clear();
      for (int64_t b = 0; b < B; ++b) terms.push_back(dout[(b * T + t) * C + c]);
      grad_sum_at(dwpe, t * C + c, at.data(), terms.data(), B);
    }
  }
}

}  // namespace lockstep::reference
