// A priori error bounds (docs/numerics.md, "Error bounds"; Higham 2002, ch. 3 and 4). Every tolerance in the test suite
// comes from here and names its derivation; none is a bare literal.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace lockstep::bounds {

// Unit roundoff of a format with p significand bits (p includes the implicit bit).
constexpr double unit_roundoff(int p) { return std::ldexp(1.0, -p); }
inline constexpr double kUnitF32 = 0x1p-24;
inline constexpr double kUnitF64 = 0x1p-53;
inline constexpr double kUnitBF16 = 0x1p-8;
inline constexpr double kUnitF16 = 0x1p-11;

// γ_n = n·u / (1 − n·u); +inf when n·u >= 1 (the bound is vacuous).
inline double gamma(int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

// |fl(Σ a_k b_k) − Σ a_k b_k| <= γ_n Σ|a_k b_k| for a length-n dot product in any order, with or
// without FMA. abs_sum is Σ|a_k b_k| (or Σ|x_k| for a plain sum, where γ_{n−1} suffices).
inline double dot_bound(int64_t n, double abs_sum, double u = kUnitF32) {
  return gamma(n, u) * abs_sum;
}

// Canonical reduction: chunk chains of at most `chunk` terms, then one exact combination and one
// rounding: γ_min(n,chunk)·Σ|terms| + u·|result|.
inline double canonical_dot_bound(int64_t n, int64_t chunk, double abs_sum, double abs_result,
                                  double u = kUnitF32) {
  return gamma(n < chunk ? n : chunk, u) * abs_sum + u * abs_result;
}

// A limited accumulator cut toward zero (the Hopper FP8 model, kernels/ops/fp8_accumulation.hpp:
// promotion intervals of `interval` terms, groups of `group` aligned to their largest term with
// `fraction_bits` kept): in an interval of L terms and G groups, each group's terms and the
// accumulator lose less than 2^-f of a magnitude at most the interval's Σ|terms| each, and the
// group's sum as much again in its normalization, so the interval's value is off by at most
// 2^-f·(L + 2G)·Σ|terms|: the coefficient of Σ|terms| returned, for a K-term product.
inline double limited_accumulation_bound(int64_t K, int64_t interval, int64_t group, int fraction_bits) {
  const int64_t L = K < interval ? K : interval, G = (L + group - 1) / group;
  return std::ldexp(static_cast<double>(L + 2 * G), -fraction_bits);
}

// VDPBF16PS's flushes (AVX512-BF16, fast mode): a subnormal input read as zero drops a product
// smaller than 2^-126 times its partner, a subnormal result flushed loses less than 2^-126; over an
// n-term dot at most 2^-126·(n + Σ(|a_k| + |b_k|)) (abs_operands = Σ(|a_k| + |b_k|)).
inline double flush_to_zero_dot_bound(int64_t n, double abs_operands) {
  return 0x1p-126 * (static_cast<double>(n) + abs_operands);
}

// Underflow: each rounding adds at most half the smallest subnormal in absolute terms.
inline constexpr double kHalfMinSubnormalF32 = 0x1p-150;

// Probabilistic bound (Higham & Mary 2019): γ̃_n(λ) = exp(λ·√n·u + n·u²/(1−u)) − 1, holding with
// probability at least 1 − 2n·exp(−λ²(1−u)²/2).
inline double gamma_probabilistic(int64_t n, double u, double lambda) {
  const double nd = static_cast<double>(n);
  return std::expm1(lambda * std::sqrt(nd) * u + nd * u * u / (1.0 - u));
}
inline double gamma_probabilistic_confidence(int64_t n, double u, double lambda) {
  return 1.0 - 2.0 * static_cast<double>(n) * std::exp(-lambda * lambda * (1 - u) * (1 - u) / 2);
}

// Rounding error of a central difference D̂ = fl(fl(f̂₊ − f̂₋) / 2h) in a format with unit roundoff
// u, where f̂± are computed values of f(x ± h) with |f̂± − f(x ± h)| <= e_plus, e_minus (e.g. the
// error bounds a Bounded<T> evaluation carries) and 2h is a power of two (the division is exact).
// The subtraction rounds once: fl(s) = s(1 + δ), |δ| <= u, so |fl(s) − s| <= u|s| <= γ_1·|fl(s)|;
// hence |D̂ − (f(x+h) − f(x−h))/2h| <= (e_plus + e_minus)/2h + γ_1(u)·|D̂|, with d_abs = |D̂|.
// Truncation (the O(h²) term) is not included: that is the finite difference's own error.
inline double central_difference_rounding_bound(double u, double e_plus, double e_minus, double h,
                                                double d_abs) {
  return (e_plus + e_minus) / (2.0 * h) + gamma(1, u) * d_abs;
}

}  // namespace lockstep::bounds
