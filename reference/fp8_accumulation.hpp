// The reference of an FP8 GEMM's accumulation (kernels/ops/fp8_accumulation.hpp) for each scalar
// type: dot_accumulated and grad_dot_accumulated are reduce.hpp's dot and grad_dot when the
// accumulation is fp32; under Accumulation::kHopperFp8
//   - plain types (double, MPFR): the exact dot — the value the emulated accumulator approximates;
//   - CanonicalF32 (canonical_f32.hpp overloads them): the model itself, bit for bit;
//   - Bounded<T>: the dot's value with an error bound that follows the model's promotion intervals
//     and groups (positions counted from the start of the range), each bounded from the terms'
//     magnitudes m_i = (|a_i| + E_ai)(|b_i| + E_bi), which bound the products the kernel forms:
//       the accumulator L of an interval is at most the sum A of the magnitudes before the group
//       (cutting toward zero never grows a value); a group's largest term is at most
//       M = max(A, max m_i), so its quantum is q ≤ 2^(⌊log2 M⌋ − 13); each of L and the products
//       loses less than min(q, its magnitude), and the normalization 2^−13 of the sum, at most
//       2^−13·(A + Σ m_i); the promotion of ⌈n/128⌉ partials rounds as γ of their count (fast
//       mode's fp32 chain; canonical mode's single rounding is within it), and the operands'
//       own errors propagate as in any dot product. The cuts are biased (toward zero), so this
//       part stays worst-case when bounded_format().lambda asks for probabilistic bounds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/ops/fp8_accumulation.hpp"
#include "reference/reduce.hpp"

namespace lockstep::reference {

namespace fp8_detail {

// Σ a[i·sa]·b[i·sb] with its error bound under the Hopper model (see the top).
template <class Real>
Real bounded_hopper_dot(const Real* a, int64_t sa, const Real* b, int64_t sb, int64_t n) {
  using T = decltype(Real{}.value);
  using std::abs;
  const double unit = std::ldexp(1.0, -kFp8AccumulatorFractionBits);  // 2^−F
  T value = 0, propagated = 0, mag = 0, cuts = 0;
  int64_t intervals = 0;
  for (int64_t k0 = 0; k0 < n; k0 += kFp8PromotionInterval, ++intervals) {
    const int64_t k1 = std::min(n, k0 + kFp8PromotionInterval);
    double before = 0;  // A: the magnitudes of the interval's terms so far
    for (int64_t g0 = k0; g0 < k1; g0 += kFp8MmaGroup) {
      const int64_t g1 = std::min(k1, g0 + kFp8MmaGroup);
      double top = before, group = 0;
      double m[kFp8MmaGroup];  // the terms' magnitudes
      for (int64_t k = g0; k < g1; ++k) {
        const Real& x = a[k * sa];
        const Real& y = b[k * sb];
        value += x.value * y.value;
        propagated += abs(x.value) * y.err + abs(y.value) * x.err + x.err * y.err;
        m[k - g0] = static_cast<double>((abs(x.value) + x.err) * (abs(y.value) + y.err));
        top = std::max(top, m[k - g0]);
        group += m[k - g0];
      }
      if (top == 0) continue;
      // top and `before` are rounded sums and products: lifted by more than their rounding, so that
      // a true value at or above a power of two never reads below it.
      const double q = std::ldexp(1.0, std::ilogb(top * (1 + 0x1p-48)) - kFp8AccumulatorFractionBits);
      double lost = std::min(q, before);
      for (int64_t k = g0; k < g1; ++k) lost += std::min(q, m[k - g0]);
      before += group;
      // The bound's own arithmetic in double: a few roundings of sums of magnitudes.
      cuts += T((lost + unit * before) * (1 + 0x1p-48));
    }
    mag += T(before);
  }
  // The partials' promotion and conversion to fp32 (an underflow each), and the double
  // arithmetic of `value` (a sum of n products in double).
  const T promotion = gamma_n<T>(intervals) * mag + T(bounded_format().underflow) * T(static_cast<double>(intervals));
  const T own = T(bounds::gamma(n, bounds::kUnitF64)) * mag;
  return Real{value, propagated + cuts + promotion + own};
}

}  // namespace fp8_detail

template <class Real>
Real dot_accumulated(Accumulation acc, const Real* a, int64_t sa, const Real* b, int64_t sb, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    if (acc == Accumulation::kHopperFp8) return fp8_detail::bounded_hopper_dot(a, sa, b, sb, n);
  }
  return dot(a, sa, b, sb, n);
}

// g[i] += Σ over tokens of a·b under `acc`. A Hopper product is added onto the gradient by one
// fp32 addition (fast mode; canonical mode adds exactly, within it).
template <class Real>
void grad_dot_accumulated(Accumulation acc, std::type_identity_t<GradOut<Real>> g, int64_t i, const Real* a, int64_t sa,
                          const Real* b, int64_t sb, int64_t n) {
  if constexpr (IsBounded<Real>::value) {
    if (acc == Accumulation::kHopperFp8) {
      g.data[i] = g.data[i] + fp8_detail::bounded_hopper_dot(a, sa, b, sb, n);
      return;
    }
  }
  grad_dot(g, i, a, sa, b, sb, n);
}

}  // namespace lockstep::reference
