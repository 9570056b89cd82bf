// The bf16 rounding of kernels/ops/cast.hpp over the reference's scalar types:
//   CanonicalF32   the rounding itself (src/core/formats.hpp), so the emulation of a bf16 recipe
//                  is the canonical fp32 emulation with these roundings where the recipe puts them;
//   Bounded<T>     the value kept, its bound grown by what one rounding to bf16 may move it:
//                  u_bf16·(|x| + err) (u_bf16 = 2^-8, the value's own uncertainty included) plus
//                  half the smallest bf16 subnormal (2^-134) for the subnormal range; unbounded
//                  where the interval reaches bf16's overflow threshold (the rounding may give inf);
//   anything else  (double, Mpfr: the exact model) unchanged: a rounding is an error, not maths.
// And the same for stochastic rounding (bf16_stochastic).
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/bounded.hpp"
#include "reference/canonical_f32.hpp"
#include "src/core/formats.hpp"
#include "src/core/philox.hpp"

namespace lockstep::reference {

inline constexpr double kUnitBf16 = kBF16Info.unit_roundoff;
inline constexpr double kHalfMinSubnormalBf16 = kBF16Info.min_subnormal / 2;
// The smallest magnitude that rounds to infinity: the largest finite bf16, (2 − 2u)·2^emax, plus
// half its ulp, u·2^emax (emax = the bias in an IEEE format).
inline const double kOverflowBf16 = std::ldexp(2.0 - kUnitBf16, kBF16Info.bias);

template <class Real>
Real bf16_rounded(const Real& x) {
  return x;
}

inline CanonicalF32 bf16_rounded(const CanonicalF32& x) { return bf16_to_f32(bf16_from_f32(x.v)); }

template <class T>
Bounded<T> bf16_rounded(const Bounded<T>& x) {
  using std::abs;
  const T reach = abs(x.value) + x.err;
  if (!(reach < T(kOverflowBf16))) return {x.value, T(INFINITY)};
  return {x.value, x.err + T(kUnitBf16) * reach + T(kHalfMinSubnormalBf16)};
}

template <class Real>
void round_to_bf16(int64_t n, Real* out, const Real* inp) {  // (n) (n)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_rounded(inp[i]);
}

// Stochastic rounding with the random word `bits` (kernels/ops/cast.hpp): for CanonicalF32 the
// rounding itself; for Bounded<T> the value kept and the bound grown by less than one bf16 quantum
// of the interval's reach — 2·u_bf16·(|x| + err) (the quantum of a value is at most 2^-7 of it)
// plus the smallest bf16 subnormal — and unbounded where the interval passes bf16's largest finite
// value (the rounding may go up to inf); anything else unchanged.
template <class Real>
Real bf16_stochastic(const Real& x, uint32_t) {
  return x;
}

inline CanonicalF32 bf16_stochastic(const CanonicalF32& x, uint32_t bits) {
  return bf16_to_f32(bf16_from_f32_sr(x.v, bits));
}

template <class T>
Bounded<T> bf16_stochastic(const Bounded<T>& x, uint32_t) {
  using std::abs;
  const T reach = abs(x.value) + x.err;
  if (!(reach <= T(kBF16Info.max_finite))) return {x.value, T(INFINITY)};
  return {x.value, x.err + T(2 * kUnitBf16) * reach + T(kBF16Info.min_subnormal)};
}

// out[i] = bf16_stochastic(inp[i], sr_bits(key, first_index + i)): the kernel's stream
// (src/core/philox.hpp); `seed`, `tensor`, `step` as kernels/ops/cast.hpp's StochasticKey.
template <class Real>
void round_to_bf16_stochastic(int64_t n, uint64_t seed, uint32_t tensor, uint32_t step, int64_t first_index,
                              Real* out, const Real* inp) {  // (n) (n)
  for (int64_t i = 0; i < n; ++i) {
    out[i] = bf16_stochastic(inp[i], sr_bits(seed, tensor, step, static_cast<uint64_t>(first_index + i)));
  }
}

}  // namespace lockstep::reference
