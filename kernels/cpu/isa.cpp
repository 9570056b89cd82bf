// Run-time ISA detection and the process-wide ISA switch (see isa.hpp).
#include "kernels/cpu/isa.hpp"

#include <atomic>

#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

// -1 until first use, then the active Isa's value; atomic so that concurrent readers are safe.
std::atomic<int> g_active{-1};

}  // namespace

std::string_view isa_name(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "avx2"; }

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == Isa::kAvx2) return avx2;
  // The avx512 build uses exactly these extensions (kernels/CMakeLists.txt LS_ISA_FLAGS_avx512).
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> r;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(isa)) r.push_back(isa);
  return r;
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  LS_REQUIRE(isa_supported(Isa::kAvx2),
             "Lockstep's CPU kernels need AVX2 and FMA (canonical mode writes every FMA "
             "explicitly and has no scalar fallback); this CPU reports avx2=",
             __builtin_cpu_supports("avx2") != 0, " fma=", __builtin_cpu_supports("fma") != 0);
  return Isa::kAvx2;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_acquire);
  if (v < 0) {
    int expected = -1;
    g_active.compare_exchange_strong(expected, static_cast<int>(best_isa()),
                                     std::memory_order_acq_rel);
    v = g_active.load(std::memory_order_acquire);
  }
  return static_cast<Isa>(v);
}

void set_isa(Isa isa) {
  LS_REQUIRE(isa_supported(isa), "set_isa(", isa_name(isa), "): this CPU does not support ",
             isa_name(isa), isa == Isa::kAvx512 ? " (needs avx512f, avx512dq, avx512bw, avx512vl)"
                                                : " (needs avx2 and fma)");
  g_active.store(static_cast<int>(isa), std::memory_order_release);
}

ScopedIsa::ScopedIsa(Isa isa) : previous_(active_isa()) { set_isa(isa); }
ScopedIsa::~ScopedIsa() { g_active.store(static_cast<int>(previous_), std::memory_order_release); }

}  // namespace lockstep::cpu
