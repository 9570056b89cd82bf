// The pieces the CanonicalF32 emulation shares with the kernels on purpose — the project's fp32
// exp, log and tanh (kernels/ops/transcendental.hpp) and the exact combination of chunk partials
// (kernels/ops/canonical.hpp's ChunkCombiner) are canonical mode's specification, so the emulation
// must use them — checked here against MPFR before the reference relies on them: every function
// within its documented accuracy on a fixed sample of inputs spread over the binades (and its
// special values), and the combination equal to the correctly rounded MPFR sum. A fault in a shared
// piece is then the reference's finding, not a bug both sides agree on.
// Not here: the exhaustive transcendental tests (tests/unit/kernels_attention/test_transcendental.cpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/ops/canonical.hpp"
#include "kernels/ops/transcendental.hpp"
#include "reference/real.hpp"

namespace lockstep::reference {

namespace canonical_checks_detail {

// |got − f(x)| <= units·2^-24·|f(x)| (+ 2^-150 for exp's subnormal results), f in MPFR.
template <class F, class G>
void check_function(const char* name, double units, F kernel, G exact) {
  ScopedMpfrBits bits(128);
  // Every 2^20-th fp32 bit pattern: 4096 inputs, both signs, every binade.
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += uint64_t{1} << 20) {
    const auto x = std::bit_cast<float>(static_cast<uint32_t>(b) | 0x5a5a5u);
    if (!std::isfinite(x)) continue;
    const Mpfr want = exact(Mpfr(x));
    const float got = kernel(x);
    const double w = static_cast<double>(want);
    // Beyond FLT_MAX the function may overflow (exactly where depends on its last rounding).
    const bool overflow = std::isinf(got) && (std::isinf(w) || std::fabs(w) > 0x1.fffffep127) && (got > 0) == (w > 0);
    const bool nan = std::isnan(w) && std::isnan(got);
    const double bound = units * 0x1p-24 * std::fabs(w) + 0x1p-150;
    if (!overflow && !nan && !(std::fabs(static_cast<double>(got) - w) <= bound)) {
      throw std::logic_error(std::string("CanonicalF32 check: ") + name + "(" + std::to_string(x) + ") = " +
                             std::to_string(got) + ", MPFR " + std::to_string(w) + ": beyond its documented " +
                             std::to_string(units) + " u");
    }
  }
}

// ChunkCombiner's result against the correctly rounded MPFR sum of the same partials.
inline void check_combination() {
  ScopedMpfrBits bits(512);  // exact for any sum of fp32 values spanning fewer than ~500 binades
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int trial = 0; trial < 64; ++trial) {
    ChunkCombiner c;
    Mpfr exact = 0;
    for (int k = 0; k < 64; ++k) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      // Mantissas of 24 bits at exponents over ±100 binades: sums a double cannot hold exactly.
      const float p = std::ldexp(static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)),
                                 static_cast<int>((s >> 8) % 200) - 100);
      c.add(p);
      exact += Mpfr(p);
    }
    const float want = to_f32(exact), got = c.finish();
    if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got)) {
      throw std::logic_error("CanonicalF32 check: the exact combination of chunk partials gives " +
                             std::to_string(got) + ", MPFR's correctly rounded sum " + std::to_string(want));
    }
  }
}

}  // namespace canonical_checks_detail

// Runs the checks once per process; std::logic_error naming the first fault.
inline void check_canonical_pieces() {
  static const bool checked = [] {
    using namespace canonical_checks_detail;
    check_function("ls_expf", 2.0, [](float x) { return ls_expf(x); }, [](const Mpfr& x) { return Mpfr(exp(x)); });
    check_function("ls_logf", 2.5, [](float x) { return ls_logf(x); },
                   [](const Mpfr& x) { return x < 0 ? Mpfr(std::nan("")) : Mpfr(log(x)); });
    check_function("ls_tanhf", 3.0, [](float x) { return ls_tanhf(x); }, [](const Mpfr& x) { return Mpfr(tanh(x)); });
    check_combination();
    return true;
  }();
  (void)checked;
}

}  // namespace lockstep::reference
