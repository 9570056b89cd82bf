// MPFR scalar types of the reference and their precision, chosen at run time.
//
// `Mpfr` is Boost.Multiprecision's variable-precision MPFR number: every value created after
// set_mpfr_bits(p) carries at least p bits (Boost counts precision in decimal digits; the bits
// actually used are reported by mpfr_bits()). MPFR operations are correctly rounded, so the
// reference's fixed evaluation order gives the same bits on any machine. `MpfrBounded` is the
// step-level bound type of the verification ladder (reference/bounded.hpp).
// Not here: fixed-precision aliases for tests (they declare their own, e.g. 100 bits).
#pragma once

#include <boost/multiprecision/mpfr.hpp>

#include "reference/bounded.hpp"

namespace lockstep::reference {

using Mpfr = boost::multiprecision::mpfr_float;
using MpfrBounded = Bounded<Mpfr>;

inline constexpr unsigned kDefaultMpfrBits = 256;

// Decimal digits Boost needs so that its binary precision is at least `bits`.
inline unsigned mpfr_digits10_for_bits(unsigned bits) {
  unsigned d = 1;
  while (boost::multiprecision::detail::digits10_2_2(d) < bits) ++d;
  return d;
}

// Sets the precision of Mpfr values created from now on (this thread); returns the bits in use.
inline unsigned set_mpfr_bits(unsigned bits) {
  Mpfr::default_precision(mpfr_digits10_for_bits(bits));
  return static_cast<unsigned>(boost::multiprecision::detail::digits10_2_2(Mpfr::default_precision()));
}

// Bits of a fresh Mpfr value at the current default precision.
inline unsigned mpfr_bits() {
  Mpfr x;
  return static_cast<unsigned>(mpfr_get_prec(x.backend().data()));
}

// Restores the previous default precision when it goes out of scope.
class ScopedMpfrBits {
 public:
  explicit ScopedMpfrBits(unsigned bits) : saved_(Mpfr::default_precision()) { set_mpfr_bits(bits); }
  ~ScopedMpfrBits() { Mpfr::default_precision(saved_); }
  ScopedMpfrBits(const ScopedMpfrBits&) = delete;
  ScopedMpfrBits& operator=(const ScopedMpfrBits&) = delete;

 private:
  unsigned saved_;
};

// x rounded once to the nearest fp32 (a conversion through double could round twice).
inline float to_f32(const Mpfr& x) { return mpfr_get_flt(x.backend().data(), MPFR_RNDN); }

}  // namespace lockstep::reference
