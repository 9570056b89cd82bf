// Reductions of the reference: the one place where summation order and its error bound live.
//
// For plain scalar types (double, mpfr_float) these are straightforward left-to-right loops: the
// reference's value. For Bounded<T> they apply the order-free rules of NUMERICS.md:
//   sum:  Σx_i,         error Σ E_i + γ_{n−1}·Σ(|x_i| + E_i)
//   dot:  Σa_i·b_i,     error Σ(|a_i|E_bi + |b_i|E_ai + E_ai·E_bi) + γ_n·Σ(|a_i|+E_ai)(|b_i|+E_bi)
// so a kernel that sums in any order (fast mode, SIMD, split-K, canonical chunks) is covered.
// Strided access: element i of x is x[i * stride].
#pragma once

#include <cmath>
#include <cstdint>

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
