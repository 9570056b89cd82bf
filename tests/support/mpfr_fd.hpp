// Gradient checks of the references in high precision: the MPFR type they are evaluated in, and a
// central-difference check of a directional derivative with a Richardson tolerance.
#pragma once

#include <gtest/gtest.h>

#include <boost/multiprecision/mpfr.hpp>
#include <iostream>
#include <string>

namespace lockstep::test {

// 100 decimal digits (about 333 bits), expression templates on: rounding in the references is
// ~1e-100 relative, far below any finite-difference error.
using Mpfr100 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<100>>;

// Checks `analytic` (the reference backward's gradient dotted with a direction r) against the
// central difference D(h) = (L(h) − L(−h)) / 2h of loss(t) = L(x + t·r), with h = 2^-20.
// D(h)'s truncation error is c·h² + O(h⁴); D(h) − D(2h) ≈ −3c·h², so |D(h) − D(2h)| bounds it
// with a factor 3 to spare. Rounding adds ~|L|·1e-100/h; 1e-95 leaves five digits of room.
template <class Real, class Loss>
void expect_matches_central_difference(const std::string& what, Loss&& loss, const Real& analytic) {
  const Real h = Real(1) / Real(1 << 20);
  const Real d1 = (loss(h) - loss(-h)) / (2 * h);
  const Real d2 = (loss(2 * h) - loss(-2 * h)) / (4 * h);
  const Real err = abs(d1 - analytic);
  const Real tol = abs(d1 - d2) + abs(loss(Real(0))) * Real("1e-95") / h;
  std::cout << what << ": directional derivative " << static_cast<double>(analytic) << ", |FD − analytic| "
            << static_cast<double>(err) << ", Richardson tolerance " << static_cast<double>(tol) << "\n";
  EXPECT_LE(err, tol) << what;
  EXPECT_GT(abs(analytic), Real(0)) << what;
}

}  // namespace lockstep::test
