// Reductions of the reference: the one place where summation order and its error bound live.
//
// For plain scalar types (double, mpfr_float) these are straightforward left-to-right loops: the
// reference's value. For Bounded<T> they apply the order-free rules of docs/numerics.md ("Bounded<T>"):
//   sum:  Σx_i,         error Σ E_i + γ_{n−1}·Σ(|x_i| + E_i)
//   dot:  Σa_i·b_i,     error Σ(|a_i|E_bi + |b_i|E_ai + E_ai·E_bi) + γ_n·Σ(|a_i|+E_ai)(|b_i|+E_bi)
// so a kernel that sums in any order (fast mode, SIMD, split-K, canonical chunks) is covered.
// Strided access: element i of x is x[i * stride].
//
// Besides the plain reductions, three families exist because canonical mode's chunking depends on
// more than the terms (reference/canonical_f32.hpp overloads each of them; for every other scalar
// type they are the plain reductions above):
//   dot_at / sum_at      gathered terms carrying their global position (chunks are ⌊pos/64⌋):
//                        embedding rows, positions, attention's dk/dv pairs;
//   sum_segments,        chunking restarted at segment boundaries: the loss over micro-batches,
//   sumsq_segments       the gradient norm over tensors;
//   GradOut, GradStore   parameter gradients, which canonical mode accumulates exactly over
//   grad_dot, grad_sum,  token chunks, ops (the tied embedding gets two) and micro-batches, and
//   grad_sum_at          rounds once; every other type adds each op's reduction with `+=`.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/bounded.hpp"
#include "verify/core/bounds.hpp"

namespace lockstep::reference {

// γ_n, or with bounded_format().lambda > 0 the probabilistic γ̃_n(λ) = exp(λ√n·u + n·u²/(1−u)) − 1
// (Higham & Mary 2019; verify/core/bounds.hpp), evaluated in double: a bound need not be exact.
template <class T>
T gamma_n(int64_t n) {
  const double lambda = bounded_format().lambda;
  if (lambda > 0) return T(bounds::gamma_probabilistic(n, bounded_format().u, lambda));
  T nu = T(static_cast<double>(n)) * Bounded<T>::u();
  return nu / (T(1) - nu);
}

// The order-free rules' running parts: Σ values, Σ propagated errors, Σ(|x| + E), and the count
// of terms (each a product or an addend) that a kernel's roundings can touch.
template <class T>
struct OrderFree {
  T v = 0, e = 0, mag = 0;
  int64_t terms = 0;

  template <class Real>
  void add(const Real& x) {
    using std::abs;
    v += x.value;
    e += x.err;
    mag += abs(x.value) + x.err;
    ++terms;
  }
  template <class Real>
  void add_product(const Real& x, const Real& y) {
    using std::abs;
    v += x.value * y.value;
    e += abs(x.value) * y.err + abs(y.value) * x.err + x.err * y.err;
    mag += (abs(x.value) + x.err) * (abs(y.value) + y.err);
    ++terms;
  }
  // Whatever the order, a term passes through at most terms − 1 additions, and a product is
  // rounded once more (none with an FMA): γ_{n−1} for a sum, γ_n for a dot product of n terms.
  template <class Real>
  Real finish(bool with_products) const {
    const int64_t roundings = terms - 1 + (with_products ? 1 : 0);
    const T under = T(bounded_format().underflow) * T(static_cast<double>(terms));
    return Real{v, e + (roundings > 0 ? gamma_n<T>(roundings) : T(0)) * mag + under};
  }
};

template <class Real>
Real sum(const Real* x, int64_t stride, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    OrderFree<decltype(Real{}.value)> acc;
    for (int64_t i = 0; i < n; ++i) acc.add(x[i * stride]);
    return acc.template finish<Real>(false);
  } else {
    Real acc = Real(0);
    for (int64_t i = 0; i < n; ++i) acc += x[i * stride];
    return acc;
  }
}

template <class Real>
Real dot(const Real* a, int64_t sa, const Real* b, int64_t sb, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    OrderFree<decltype(Real{}.value)> acc;
    for (int64_t i = 0; i < n; ++i) acc.add_product(a[i * sa], b[i * sb]);
    return acc.template finish<Real>(true);
  } else {
    Real acc = Real(0);
    for (int64_t i = 0; i < n; ++i) acc += a[i * sa] * b[i * sb];
    return acc;
  }
}

template <class Real>
Real dot_at(const int64_t* pos, const Real* a, const Real* b, int64_t n) {  // pos: positions
  return dot(a, 1, b, 1, n);
}
template <class Real>
Real sum_at(const int64_t* pos, const Real* x, int64_t n) {
  return sum(x, 1, n);
}

// bounds = {0, b1, ..., n}: segment boundaries (ignored by the order-free reductions).
template <class Real>
Real sum_segments(const Real* x, const std::vector<int64_t>& bounds) {
  return sum(x, 1, bounds.back());
}
template <class Real>
Real sumsq_segments(const Real* x, const std::vector<int64_t>& bounds) {
  return dot(x, 1, x, 1, bounds.back());
}

// Destination of a parameter gradient (+=); converts implicitly from a plain pointer. nullptr:
// the gradient is not wanted.
template <class Real>
struct GradOut {
  Real* data = nullptr;

  GradOut() = default;
  GradOut(Real* p) : data(p) {}  // NOLINT: plain buffers convert implicitly
  explicit operator bool() const { return data != nullptr; }
};

// Parameter gradients accumulate into what the buffer holds (earlier ops, micro-batches). A fast
// kernel may add its terms into it one by one (`+=` per token), so for Bounded types the existing
// value is one more term of the order-free sum, not a separately rounded addend.
template <class Real, class Terms>
void grad_accumulate_bounded(GradOut<Real> g, int64_t i, bool with_products, Terms&& add_terms) {
  OrderFree<decltype(Real{}.value)> acc;
  acc.add(g.data[i]);
  add_terms(acc);
  g.data[i] = acc.template finish<Real>(with_products);
}

// g[i] += Σ a[k·sa]·b[k·sb] over tokens k in [0, n).
template <class Real>
void grad_dot(GradOut<Real> g, int64_t i, const Real* a, int64_t sa, const Real* b, int64_t sb,
              int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    grad_accumulate_bounded(g, i, true, [&](auto& acc) {
      for (int64_t k = 0; k < n; ++k) acc.add_product(a[k * sa], b[k * sb]);
    });
  } else {
    g.data[i] += dot(a, sa, b, sb, n);
  }
}
// g[i] += Σ x[k·sx] over tokens k in [0, n).
template <class Real>
void grad_sum(GradOut<Real> g, int64_t i, const Real* x, int64_t sx, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    grad_accumulate_bounded(g, i, false, [&](auto& acc) {
      for (int64_t k = 0; k < n; ++k) acc.add(x[k * sx]);
    });
  } else {
    g.data[i] += sum(x, sx, n);
  }
}
// g[i] += Σ x[k] over gathered tokens at global positions pos[k].
template <class Real>
void grad_sum_at(GradOut<Real> g, int64_t i, const int64_t* pos, const Real* x, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    grad_sum(g, i, x, 1, n);
  } else {
    g.data[i] += sum_at(pos, x, n);
  }
}

// All parameter gradients of a model: `out(offset)` is the sink of the tensor starting at
// `offset`, finish() makes `g` final (a no-op here; canonical mode rounds its exact sums).
template <class Real>
struct GradStore {
  std::vector<Real> g;

  void reset(int64_t n) { g.assign(static_cast<size_t>(n), Real(0)); }
  GradOut<Real> out(int64_t offset) { return {g.data() + offset}; }
  void finish() {}
};

// Value and error bound of a reference scalar, whatever its type (plain types have no bound).
template <class Real>
double value_of(const Real& x) {
  if constexpr (IsBounded<Real>::value) {
    return static_cast<double>(x.value);
  } else {
    return static_cast<double>(x);
  }
}
template <class Real>
double bound_of(const Real& x) {
  if constexpr (IsBounded<Real>::value) {
    return static_cast<double>(x.err);
  } else {
    return 0.0;
  }
}

}  // namespace lockstep::reference
