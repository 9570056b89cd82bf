// The bf16 rounding of kernels/ops/cast.hpp over the reference's scalar types:
//   CanonicalF32   the rounding itself (src/core/formats.hpp), so the emulation of a bf16 recipe
//                  is the canonical fp32 emulation with these roundings where the recipe puts them;
//   Bounded<T>     the value kept, its bound grown by what one rounding to bf16 may move it:
//                  u_bf16·(|x| + err) (u_bf16 = 2^-8, the value's own uncertainty included) plus
//                  half the smallest bf16 subnormal (2^-134) for the subnormal range; unbounded
//                  where the interval reaches bf16's overflow threshold (the rounding may give inf);
//   anything else  (double, Mpfr: the exact model) unchanged: a rounding is an error, not maths.
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/bounded.hpp"
#include "reference/canonical_f32.hpp"
#include "src/core/formats.hpp"

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

}  // namespace lockstep::reference
