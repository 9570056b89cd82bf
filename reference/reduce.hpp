// Reductions of the reference: the one place where summation order and its error bound live.
//
// For plain scalar types (double, mpfr_float) these are straightforward left-to-right loops: the
// reference's value. For Bounded<T> they apply the order-free rules of NUMERICS.md:
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

namespace lockstep::reference {

template <class T>
T gamma_n(int64_t n) {
  T nu = T(static_cast<double>(n)) * Bounded<T>::u();
  return nu / (T(1) - nu);
}

template <class Real>
Real sum(const Real* x, int64_t stride, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    using T = decltype(Real{}.value);
    using std::abs;
    T v = 0, e = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      v += x[i * stride].value;
      e += x[i * stride].err;
      mag += abs(x[i * stride].value) + x[i * stride].err;
    }
    const T under = T(bounded_format().underflow) * T(static_cast<double>(n));
    return Real{v, e + (n > 1 ? gamma_n<T>(n - 1) : T(0)) * mag + under};
  } else {
    Real acc = Real(0);
    for (int64_t i = 0; i < n; ++i) acc += x[i * stride];
    return acc;
  }
}

template <class Real>
Real dot(const Real* a, int64_t sa, const Real* b, int64_t sb, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    using T = decltype(Real{}.value);
    using std::abs;
    T v = 0, e = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Real& x = a[i * sa];
      const Real& y = b[i * sb];
      v += x.value * y.value;
      e += abs(x.value) * y.err + abs(y.value) * x.err + x.err * y.err;
      mag += (abs(x.value) + x.err) * (abs(y.value) + y.err);
    }
    const T under = T(bounded_format().underflow) * T(static_cast<double>(n));
    return Real{v, e + gamma_n<T>(n) * mag + under};
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

// g[i] += Σ a[k·sa]·b[k·sb] over tokens k in [0, n).
template <class Real>
void grad_dot(GradOut<Real> g, int64_t i, const Real* a, int64_t sa, const Real* b, int64_t sb,
              int64_t n) {
  g.data[i] += dot(a, sa, b, sb, n);
}
// g[i] += Σ x[k·sx] over tokens k in [0, n).
template <class Real>
void grad_sum(GradOut<Real> g, int64_t i, const Real* x, int64_t sx, int64_t n) {
  g.data[i] += sum(x, sx, n);
}
// g[i] += Σ x[k] over gathered tokens at global positions pos[k].
template <class Real>
void grad_sum_at(GradOut<Real> g, int64_t i, const int64_t* pos, const Real* x, int64_t n) {
  g.data[i] += sum_at(pos, x, n);
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
