// Bounded<T>: a value and a rigorous first-order bound on the error of what a kernel computing the
// same expression in a lower-precision format (fp32 by default) may have produced, whatever order
// it summed in (running error analysis, docs/numerics.md "Bounded<T>").
//
// Instantiate the templated reference ops (reference/*.hpp) with Bounded<double> (bounds for tests
// of fp32 kernels: the double value is itself off by ~1e-16 relative, far below fp32 bounds) or
// Bounded<mpfr_float> (the verification ladder's step-level bounds). Reductions must go through
// reference/reduce.hpp so that the sum rule γ_{n−1}·Σ(|x|+E) — valid for *any* order — is used
// instead of the order-specific bound a loop of `+=` would give.
//
// Not here: the kernels (this knows nothing of them) and the comparison (verify/core/compare.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lockstep::reference {

// Unit roundoff of the format results are rounded to, and the accuracy every kernel's exp, log and
// tanh must meet (in units of that roundoff); tests of the transcendentals check the latter.
struct BoundedFormat {
  double u = 0x1p-24;                      // fp32
  double transcendental_units = 4.0;       // |f̂(x) − f(x)| <= 4u·|f(x)| (2 ulp)
  double underflow = 0x1p-150;             // half the smallest fp32 subnormal, per rounding
  // Absolute error per position of an angle computed in double by set-up code (RoPE's tables:
  // kernels/ops/rope.hpp), beside the rounding of the table entry to the format.
  double setup_angle_error = 0x1p-49;
  // 0: worst-case bounds. λ > 0: every n-term reduction's accumulated rounding error is bounded
  // by Higham & Mary's probabilistic γ̃_n(λ) in place of γ_n (reference/reduce.hpp) — a bound that
  // holds with probability at least 1 − 2n·exp(−λ²(1−u)²/2) per reduction if the roundings are
  // mean-independent random errors, and no longer in the worst case.
  double lambda = 0;
};
inline BoundedFormat& bounded_format() {
  static BoundedFormat f;
  return f;
}

// The unit roundoff a Bounded<double> reference uses to cover its own arithmetic as well: every
// value it computes is off from the exact one by at most one double rounding (u_64 = 2^-53) per
// operation and γ_n(u_64)·Σ|x| per n-term sum, which the same rules with u_32 + 4·u_64 in place of
// u_32 bound (γ_n is superadditive in u). What is left uncovered is the rounding of the bound's own
// arithmetic, about 1e-15 of each bound.
inline constexpr double kBoundedDoubleU = 0x1p-24 + 0x1p-51;

// Sets bounded_format() for a scope (e.g. kBoundedDoubleU for a Bounded<double> reference).
class ScopedBoundedFormat {
 public:
  explicit ScopedBoundedFormat(BoundedFormat f) : saved_(bounded_format()) { bounded_format() = f; }
  ~ScopedBoundedFormat() { bounded_format() = saved_; }
  ScopedBoundedFormat(const ScopedBoundedFormat&) = delete;
  ScopedBoundedFormat& operator=(const ScopedBoundedFormat&) = delete;

 private:
  BoundedFormat saved_;
};

// The scope of a Bounded<double> reference: the format as it is, with kBoundedDoubleU for u, so
// that the reference's own double roundings are counted into its bounds.
inline ScopedBoundedFormat with_double_roundings() {
  BoundedFormat f = bounded_format();
  f.u = kBoundedDoubleU;
  return ScopedBoundedFormat(f);
}

template <class T>
struct Bounded {
  T value{};
  T err{};

  Bounded() = default;
  Bounded(T v) : value(v), err(0) {}  // NOLINT: exact inputs convert implicitly
  Bounded(T v, T e) : value(v), err(e) {}
  // Exact arithmetic inputs (fp32 constants, integers). A template, so that a float reaches T
  // exactly instead of converting to int, which a plain Bounded(int) would do for class types T.
  template <class A>
    requires std::is_arithmetic_v<A>
  Bounded(A v) : value(v), err(0) {}  // NOLINT

  static T u() { return T(bounded_format().u); }
  static T rounding(const T& x) {  // error of one rounding of x into the format
    using std::abs;
    return u() * abs(x) + T(bounded_format().underflow);
  }

  friend Bounded operator+(const Bounded& a, const Bounded& b) {
    T v = a.value + b.value;
    return {v, a.err + b.err + rounding(v)};
  }
  friend Bounded operator-(const Bounded& a, const Bounded& b) {
    T v = a.value - b.value;
    return {v, a.err + b.err + rounding(v)};
  }
  friend Bounded operator-(const Bounded& a) { return {-a.value, a.err}; }
  friend Bounded operator*(const Bounded& a, const Bounded& b) {
    using std::abs;
    T v = a.value * b.value;
    return {v, abs(a.value) * b.err + abs(b.value) * a.err + a.err * b.err + rounding(v)};
  }
  friend Bounded operator/(const Bounded& a, const Bounded& b) {
    using std::abs;
    T v = a.value / b.value;
    T denom = abs(b.value) - b.err;
    if (!(denom > T(0))) return {v, T(INFINITY)};  // the divisor's interval holds zero
    return {v, (a.err + abs(v) * b.err) / denom + rounding(v)};
  }
  Bounded& operator+=(const Bounded& o) { return *this = *this + o; }
  Bounded& operator-=(const Bounded& o) { return *this = *this - o; }
  Bounded& operator*=(const Bounded& o) { return *this = *this * o; }
  Bounded& operator/=(const Bounded& o) { return *this = *this / o; }

  // Comparisons look at values: branches (masks, max) follow the reference's path.
  friend bool operator<(const Bounded& a, const Bounded& b) { return a.value < b.value; }
  friend bool operator>(const Bounded& a, const Bounded& b) { return a.value > b.value; }
  friend bool operator<=(const Bounded& a, const Bounded& b) { return a.value <= b.value; }
  friend bool operator>=(const Bounded& a, const Bounded& b) { return a.value >= b.value; }
  friend bool operator==(const Bounded& a, const Bounded& b) { return a.value == b.value; }
};

template <class T>
Bounded<T> fma(const Bounded<T>& a, const Bounded<T>& b, const Bounded<T>& c) {
  using std::abs;
  T v = a.value * b.value + c.value;
  return {v, abs(a.value) * b.err + abs(b.value) * a.err + a.err * b.err + c.err +
                 Bounded<T>::rounding(v)};
}

template <class T>
Bounded<T> abs(const Bounded<T>& a) {
  using std::abs;
  return {abs(a.value), a.err};
}

// max is 1-Lipschitz in each argument and exact (no rounding).
template <class T>
Bounded<T> max(const Bounded<T>& a, const Bounded<T>& b) {
  return {a.value >= b.value ? a.value : b.value, a.err > b.err ? a.err : b.err};
}

template <class T>
Bounded<T> sqrt(const Bounded<T>& a) {
  using std::sqrt;
  T v = sqrt(a.value);
  T lo = a.value - a.err;
  if (!(lo > T(0))) return {v, sqrt(a.err) + Bounded<T>::rounding(v)};  // |√x − √y| <= √|x − y|
  return {v, a.err / (sqrt(lo) + v) + Bounded<T>::rounding(v)};
}

// exp: e^a·(e^{E_a} − 1) from the input's error, plus the kernel's own accuracy.
template <class T>
Bounded<T> exp(const Bounded<T>& a) {
  using std::exp;
  using std::expm1;
  T v = exp(a.value);
  T acc = T(bounded_format().transcendental_units) * Bounded<T>::u();
  return {v, v * expm1(a.err) + acc * v * exp(a.err) + T(bounded_format().underflow)};
}

// log: |log(a ± E) − log a| <= E / (a − E) for a > E, plus the kernel's own accuracy.
template <class T>
Bounded<T> log(const Bounded<T>& a) {
  using std::abs;
  using std::log;
  T v = log(a.value);
  T acc = T(bounded_format().transcendental_units) * Bounded<T>::u();
  T lo = a.value - a.err;
  if (!(lo > T(0))) return {v, T(INFINITY)};
  return {v, a.err / lo + acc * abs(v) + T(bounded_format().underflow)};
}

// tanh is 1-Lipschitz.
template <class T>
Bounded<T> tanh(const Bounded<T>& a) {
  using std::abs;
  using std::tanh;
  T v = tanh(a.value);
  T acc = T(bounded_format().transcendental_units) * Bounded<T>::u();
  return {v, a.err + acc * abs(v) + T(bounded_format().underflow)};
}

template <class T>
struct IsBounded : std::false_type {};
template <class T>
struct IsBounded<Bounded<T>> : std::true_type {};

}  // namespace lockstep::reference
