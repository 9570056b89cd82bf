// Run-time choice of the SIMD instruction set used by the CPU kernels.
//
// Files named kernels/cpu/*.isa.cpp are compiled twice (kernels/CMakeLists.txt): once for AVX2+FMA
// into namespace lockstep::cpu::avx2 and once for AVX-512 (F, DQ, BW, VL) into
// lockstep::cpu::avx512. Plain .cpp kernels call the variant named by active_isa(). AVX2+FMA is the
// floor: every canonical kernel is written with explicit FMA instructions and has no fallback.
//
// The choice is process-wide (tests switch it to run the same canonical kernel on both ISAs and
// require identical bits); it is read once per kernel call, before any parallel region, so a
// kernel call never mixes ISAs.
// Not here: the kernels themselves, or any control of the floating-point environment.
#pragma once

#include <string_view>
#include <vector>

namespace lockstep::cpu {

enum class Isa {
  kAvx2,    // AVX2 + FMA, 256-bit vectors
  kAvx512,  // AVX-512 F/DQ/BW/VL, 512-bit vectors
};

std::string_view isa_name(Isa isa);

// Whether this CPU can run kernels built for `isa`.
bool isa_supported(Isa isa);

// The widest ISA this CPU supports. Throws ConfigError when it lacks AVX2 or FMA.
Isa best_isa();

// Every ISA this CPU supports, narrowest first (tests run a kernel on each).
std::vector<Isa> supported_isas();

// The ISA kernels use now: best_isa() unless set_isa() chose another.
Isa active_isa();

// Makes kernels use `isa` from now on. Throws ConfigError when the CPU lacks it.
void set_isa(Isa isa);

// Sets the ISA for a scope and restores the previous one on exit (tests, benchmarks).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa previous_;
};

}  // namespace lockstep::cpu
