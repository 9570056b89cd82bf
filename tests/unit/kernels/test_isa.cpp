// Tests of kernels/cpu/isa.hpp: detection, the process-wide switch, ScopedIsa, and refusal of an
// ISA the CPU lacks.
#include "kernels/cpu/isa.hpp"

#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "src/core/check.hpp"

namespace lockstep::cpu {
namespace {

TEST(Isa, BestIsSupportedAndActiveByDefault) {
  const Isa best = best_isa();
  EXPECT_TRUE(isa_supported(best));
  EXPECT_TRUE(isa_supported(Isa::kAvx2));  // best_isa() would have thrown otherwise
  if (isa_supported(Isa::kAvx512)) {
    EXPECT_EQ(best, Isa::kAvx512);
  }
  EXPECT_EQ(active_isa(), best);
  std::cout << "best ISA: " << isa_name(best) << "\n";
}

TEST(Isa, SetAndScopedOverrideRestore) {
  const Isa before = active_isa();
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    {
      ScopedIsa scope(isa);
      EXPECT_EQ(active_isa(), isa);
      {
        ScopedIsa inner(Isa::kAvx2);
        EXPECT_EQ(active_isa(), Isa::kAvx2);
      }
      EXPECT_EQ(active_isa(), isa);
    }
    EXPECT_EQ(active_isa(), before);
  }
  set_isa(Isa::kAvx2);
  EXPECT_EQ(active_isa(), Isa::kAvx2);
  set_isa(before);
  EXPECT_EQ(active_isa(), before);
}

TEST(Isa, RefusesUnsupported) {
  if (isa_supported(Isa::kAvx512)) GTEST_SKIP() << "this CPU supports every ISA Lockstep builds";
  const Isa before = active_isa();
  EXPECT_THROW(set_isa(Isa::kAvx512), ConfigError);
  EXPECT_THROW(ScopedIsa scope(Isa::kAvx512), ConfigError);
  EXPECT_EQ(active_isa(), before);
  try {
    set_isa(Isa::kAvx512);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not support avx512"), std::string::npos) << e.what();
  }
}

TEST(Isa, Names) {
  EXPECT_EQ(isa_name(Isa::kAvx2), "avx2");
  EXPECT_EQ(isa_name(Isa::kAvx512), "avx512");
}

}  // namespace
}  // namespace lockstep::cpu
