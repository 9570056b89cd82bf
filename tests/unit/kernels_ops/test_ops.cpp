// The op test driver (ggml's test-backend-ops, with a rigorous oracle instead of a sibling
// backend): every op of kernels/ops/ops.def × mode (canonical, fast) × backend (the CPU at each
// ISA it supports; CUDA where built and a device is present, once its backend exists) × size
// class (1, primes, odd, reductions past the kernels' blocks) × value class (ordinary, ±0,
// subnormals, near-overflow, NaN/Inf), each output within the bound a Bounded<double> reference
// derives from the operands and, in canonical mode, bit for bit the CanonicalF32 emulation
// (tests/support/op_cases.hpp). One test per op; a failure names the case (op, mode, ISA, shape,
// values, seed) and prints the first mismatches with their references and bounds.
// Not here: random-shape searches (tests/property), thread-count invariance (tests/unit/kernels*).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/isa.hpp"
#include "reference/bounded.hpp"
#include "tests/support/op_cases.hpp"

namespace lockstep::test {
namespace {


void run_grid(const OpEntry& entry) {
  const reference::ScopedBoundedFormat own_roundings = reference::with_double_roundings();
  CpuBackend backend = CpuBackend::current();
  int64_t cases = 0, vacuous = 0;
  double tightness = 0;
  uint64_t seed = 1;
  for (SizeClass size : {SizeClass::kOne, SizeClass::kPrime, SizeClass::kOdd, SizeClass::kLong}) {
    for (ValueClass values : {ValueClass::kOrdinary, ValueClass::kZeros, ValueClass::kSubnormals, ValueClass::kLarge,
                              ValueClass::kNonFinite}) {
      for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
        for (cpu::Isa isa : cpu::supported_isas()) {
          cpu::ScopedIsa scoped(isa);
          const CaseSpec spec{size, values, seed++};
          const auto c = entry.make(spec);
          c->run(backend, mode);
          const std::string where = std::string(entry.name) + " " + std::string(mode_name(mode)) + " " +
                                    std::string(cpu::isa_name(isa)) + " size " + size_name(size) + " (" + c->shape() +
                                    ") values " + value_name(values) + " seed " + std::to_string(spec.seed);
          for (const Check& k : c->checks(mode)) {
            ASSERT_EQ(k.got.size(), k.bounded.size()) << where << " " << k.what;
            const verify::CompareReport b =
                compare_bounded(k.got.data(), k.bounded.data(), static_cast<int64_t>(k.got.size()), &vacuous);
            EXPECT_TRUE(b.ok()) << b.summary(where + " " + k.what + " within the Bounded<double> bound");
            tightness = std::max(tightness, b.max_tightness);
            if (!k.exact.empty()) {
              ASSERT_EQ(k.got.size(), k.exact.size()) << where << " " << k.what;
              const verify::CompareReport e =
                  verify::compare_exact(k.got.data(), k.exact.data(), static_cast<int64_t>(k.got.size()));
              EXPECT_TRUE(e.ok()) << e.summary(where + " " + k.what + " bitwise against CanonicalF32");
            }
          }
          ++cases;
        }
      }
    }
  }
  std::printf("%s: %lld cases, max err/bound %.3g, %lld vacuous bound elements\n", std::string(entry.name).c_str(),
              static_cast<long long>(cases), tightness, static_cast<long long>(vacuous));
  ::testing::Test::RecordProperty("max_tightness", std::to_string(tightness));
}

// One test per op of ops.def.
#define LS_OP(op, params, args) \
  TEST(OpDriver, op) { run_grid({#op, &make_##op}); }
#include "kernels/ops/ops.def"
#undef LS_OP

}  // namespace
}  // namespace lockstep::test
