// Reference softmax cross-entropy (fused forward+backward, and forward only), templated on the
// scalar type: the contract of kernels/ops/crossentropy.hpp in plain single-threaded loops.
//
// Argument order as the kernels', with explicit dims. Z goes through reference::sum (order-free
// bounds for Bounded<T>); exp and log via ADL. Targets are assumed valid (the kernels check them).
// Not here: target validation, vocabulary parallelism.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/bounded.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

template <class Real>
Real crossentropy_max(const Real& a, const Real& b) {
  if constexpr (IsBounded<Real>::value) {
    return max(a, b);
  } else {
    return a > b ? a : b;
  }
}

// losses: (N); logits: (N, V), overwritten with dlogits when `backward`; targets: (N).
template <class Real>
void crossentropy_rows(int64_t N, int64_t V, Real dloss, Real* losses, Real* logits,
                       const int32_t* targets, bool backward) {
  using std::exp;
  using std::log;
  std::vector<Real> e(V);
  for (int64_t n = 0; n < N; ++n) {
    Real* x = logits + n * V;
    Real m = x[0];
    for (int64_t v = 1; v < V; ++v) m = crossentropy_max(m, x[v]);
    for (int64_t v = 0; v < V; ++v) e[v] = exp(x[v] - m);
    const Real Z = sum(e.data(), 1, V);
    losses[n] = (m + log(Z)) - x[targets[n]];
    if (!backward) continue;
    // losses = (m + log Z) − x[y], Z = Σ exp(x[v] − m)  =>  dx[v] = (e[v]/Z − [v == y])·dloss
    for (int64_t v = 0; v < V; ++v) x[v] = (e[v] / Z - Real(v == targets[n] ? 1 : 0)) * dloss;
  }
}

template <class Real>
void crossentropy_forward_backward(int64_t N, int64_t V, Real dloss, Real* losses, Real* logits,
                                   const int32_t* targets) {
  crossentropy_rows(N, V, dloss, losses, logits, targets, true);
}

template <class Real>
void crossentropy_forward(int64_t N, int64_t V, Real* losses, const Real* logits,
                          const int32_t* targets) {
  std::vector<Real> copy(logits, logits + N * V);
  crossentropy_rows(N, V, Real(0), losses, copy.data(), targets, false);
}

}  // namespace lockstep::reference
