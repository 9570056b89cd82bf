// Gradient checks of the references in high precision: the MPFR type they are evaluated in, and a
// central-difference check of a directional derivative whose tolerance is derived, not chosen.
#pragma once

#include <gtest/gtest.h>

#include <boost/multiprecision/mpfr.hpp>
#include <iostream>
#include <limits>
#include <string>

#include "reference/bounded.hpp"
#include "verify/core/bounds.hpp"

namespace lockstep::test {

// 100 decimal digits (about 333 bits), expression templates on: rounding in the references is
// ~1e-100 relative, far below any finite-difference error.
using Mpfr100 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<100>>;

// Checks the reference backward's directional derivative against the central difference
// D(h) = (L(h) − L(−h)) / 2h of loss(t) = L(x + t·r), h = 2^-20.
//  - truncation: D(h) = D + c·h² + O(h⁴) and D(h) − D(2h) ≈ −3c·h², so |D(h) − D(2h)| bounds it
//    with a factor 3 to spare (Richardson);
//  - rounding: both sides are evaluated in Bounded<Real> charging every operation Real's unit
//    roundoff (MPFR rounds correctly: exp/log/tanh one unit; no underflow), so the rounding of
//    each L(±h) (bounds::central_difference_rounding_bound) and of the analytic value is bounded
//    by the evaluation itself. Bounded<Real> computes the same values as Real.
// `loss(h)` and `analytic()` are generic lambdas: called with Real's Bounded type they return it.
template <class Real, class Loss, class Analytic>
void expect_matches_central_difference(const std::string& what, Loss&& loss, Analytic&& analytic_of) {
  using B = reference::Bounded<Real>;
  const double u = bounds::unit_roundoff(std::numeric_limits<Real>::digits);
  reference::ScopedBoundedFormat charge_real({u, 1.0, 0.0});
  auto central = [&](const Real& h, Real* rounding) {
    const B plus = loss(B(h)), minus = loss(B(-h));
    const Real d = (plus.value - minus.value) / (2 * h);
    *rounding = Real(bounds::central_difference_rounding_bound(
        u, static_cast<double>(plus.err), static_cast<double>(minus.err), static_cast<double>(h),
        static_cast<double>(abs(d))));
    return d;
  };
  const Real h = Real(1) / Real(1 << 20);
  Real r1, r2;
  const Real d1 = central(h, &r1), d2 = central(2 * h, &r2);
  const B analytic = analytic_of.template operator()<B>();
  const Real err = abs(d1 - analytic.value);
  // The double conversions above round to nearest: 2^-50 relative covers them.
  const Real tol = abs(d1 - d2) + (r1 + r2 + analytic.err) * (1 + Real(0x1p-50));
  std::cout << what << ": directional derivative " << static_cast<double>(analytic.value)
            << ", |FD − analytic| " << static_cast<double>(err) << ", tolerance "
            << static_cast<double>(tol) << " (rounding part " << static_cast<double>(r1 + r2 + analytic.err)
            << ")\n";
  EXPECT_LE(err, tol) << what;
  EXPECT_GT(abs(analytic.value), Real(0)) << what;
}

}  // namespace lockstep::test
