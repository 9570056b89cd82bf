// Reference AdamW, gradient sum of squares and gradient scaling, templated on the scalar type.
//
// Mirrors kernels/ops/optim.hpp operation for operation; hyperparameters are the caller's fp32
// values converted to Real. The sum of squares goes through reference::dot, so a Bounded<T>
// instantiation bounds canonical chunking and fast mode alike.
// Not here: clipping policy, schedules.
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/reduce.hpp"

namespace lockstep::reference {

// The same fields as kernels/ops/optim.hpp's AdamWParams (the reference does not depend on kernels/).
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bc1, bc2;  // bias corrections 1 - beta^t
};

// m = beta1·m + (1-beta1)·g;  v = beta2·v + (1-beta2)·(g·g);  mhat = m/bc1;  vhat = v/bc2;
// p = p - lr·(mhat/(sqrt(vhat) + eps) + wd·p)
template <class Real>
void adamw_update(int64_t n, AdamWParams h,
                  Real* param, Real* m, Real* v,                  // (n) (n) (n) updated
                  const Real* grad) {                             // (n)
  using std::sqrt;
  const Real b1 = Real(h.beta1), b2 = Real(h.beta2);
  const Real omb1 = Real(1) - b1, omb2 = Real(1) - b2;
  for (int64_t i = 0; i < n; ++i) {
    const Real& g = grad[i];
    m[i] = b1 * m[i] + omb1 * g;
    v[i] = b2 * v[i] + omb2 * (g * g);
    const Real mhat = m[i] / Real(h.bc1);
    const Real vhat = v[i] / Real(h.bc2);
    param[i] = param[i] - Real(h.lr) * (mhat / (sqrt(vhat) + Real(h.eps)) +
                                        Real(h.weight_decay) * param[i]);
  }
}

// acc += Σ g² over the buffer.
template <class Real>
void grad_sumsq_accumulate(int64_t n, Real& acc, const Real* grad) {  // (n)
  acc += dot(grad, 1, grad, 1, n);
}

// g = g·scale
template <class Real>
void scale_inplace(int64_t n, Real* g, float scale) {  // (n)
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * Real(scale);
}

}  // namespace lockstep::reference
