// RoPE's cos/sin tables computed by the reference from the model's description alone (T, HS, θ),
// not taken from the kernels:
//   exact      cos and sin of t·θ^(−2i/HS) in MPFR: what Mpfr and double take, and the Bounded
//              types with, as each entry's bound, the accuracy kernels/ops/rope.hpp documents for
//              its fp32 tables (one fp32 rounding, u·|v|, plus T·2^-49 for the double angle) — so a
//              fast-mode kernel's tables within that accuracy pass and any others fail;
//   canonical  the fp32 tables canonical mode specifies, for CanonicalF32: inv_freq_i =
//              exp(−(2i/HS)·log θ), angle = t·inv_freq_i and its cos and sin in double with the
//              project's deterministic functions (src/core/det_math.hpp, shared on purpose: they are
//              the specification), rounded once to fp32 — and each entry checked here against the
//              exact value within the same accuracy, so that a fault in the shared functions is the
//              reference's finding rather than a bug both sides share.
// Not here: the rotation (reference/attention.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/bounded.hpp"
#include "reference/canonical_f32.hpp"
#include "reference/real.hpp"
#include "src/core/det_math.hpp"

namespace lockstep::reference {

// The documented accuracy of a table entry of value v at T positions: one rounding to the format
// and the double angle's error (the format in force; the canonical fp32 tables are held to the
// defaults, fp32 and 2^-49 per position).
inline double rope_table_accuracy(double v, int64_t T, const BoundedFormat& f = bounded_format()) {
  return f.u * std::fabs(v) + static_cast<double>(T) * f.setup_angle_error;
}

// cos (which = 0) or sin (which = 1) of t·θ^(−2i/HS) at 128 bits or the current MPFR precision,
// whichever is higher.
inline Mpfr rope_exact(int64_t t, int64_t i, int64_t HS, double theta, int which) {
  ScopedMpfrBits bits(std::max(128u, mpfr_bits()));
  const Mpfr angle = Mpfr(t) * boost::multiprecision::pow(Mpfr(theta), Mpfr(-2 * i) / Mpfr(HS));
  return which == 0 ? Mpfr(cos(angle)) : Mpfr(sin(angle));
}

// The canonical fp32 entry (see the header), checked against the exact value.
inline float rope_canonical(int64_t t, int64_t i, int64_t T, int64_t HS, double theta, int which) {
  const double inv_freq = det::exp(-(static_cast<double>(2 * i) / static_cast<double>(HS)) * det::log(theta));
  double c, s;
  det::cos_sin(static_cast<double>(t) * inv_freq, &c, &s);
  const auto v = static_cast<float>(which == 0 ? c : s);
  const double exact = static_cast<double>(rope_exact(t, i, HS, theta, which));
  if (!(std::fabs(static_cast<double>(v) - exact) <= rope_table_accuracy(exact, T, BoundedFormat{}))) {
    throw std::logic_error("reference RoPE tables: the canonical " + std::string(which == 0 ? "cos" : "sin") + " at t=" +
                           std::to_string(t) + " i=" + std::to_string(i) + " is " + std::to_string(v) +
                           ", MPFR gives " + std::to_string(exact) + " (beyond rope.hpp's accuracy)");
  }
  return v;
}

// Tables (T, HS/2) of cos and sin in Real.
template <class Real>
void rope_tables(int64_t T, int64_t HS, double theta, std::vector<Real>& cos_table, std::vector<Real>& sin_table) {
  const int64_t half = HS / 2;
  cos_table.resize(static_cast<size_t>(T * half));
  sin_table.resize(cos_table.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      for (int which : {0, 1}) {
        Real& out = (which == 0 ? cos_table : sin_table)[static_cast<size_t>(t * half + i)];
        if constexpr (std::is_same_v<Real, CanonicalF32>) {
          out = CanonicalF32(rope_canonical(t, i, T, HS, theta, which));
        } else {
          const Mpfr exact = rope_exact(t, i, HS, theta, which);
          if constexpr (IsBounded<Real>::value) {
            using V = decltype(Real{}.value);
            out = Real(V(exact), V(rope_table_accuracy(static_cast<double>(exact), T)));
          } else {
            out = Real(exact);
          }
        }
      }
    }
  }
}

}  // namespace lockstep::reference
