// The frame of the op test driver (tests/unit/kernels_ops) and of the generated kernel benchmarks:
// a case is one op of kernels/ops/ops.def at one size class with one class of values; it draws its
// inputs from a seed, runs the op on a Backend, and checks what the backend wrote against the
// references — Bounded<double> (the value and a bound derived from the operands, valid for any
// summation order) in both modes, and, in canonical mode, the CanonicalF32 emulation bit for bit.
// Not here: the cases themselves (op_cases.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "reference/bounded.hpp"
#include "reference/canonical_f32.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::test {

// Dimensions: every one 1; small primes; odd composites; a reduction longer than the kernels'
// blocks (K > 1024, a vocabulary over 4096, sequences over two chunks); the shapes of
// scripts/configs/bench_small.toml and bench_medium.toml (the benchmarks').
enum class SizeClass { kOne, kPrime, kOdd, kLong, kBenchSmall, kBenchMedium };
// Values: dyadic values over a few binades; with ±0 mixed in; with subnormals; with magnitudes near
// what the op can take before its sums overflow; with one NaN or ±inf.
enum class ValueClass { kOrdinary, kZeros, kSubnormals, kLarge, kNonFinite };

inline const char* size_name(SizeClass s) {
  static const char* const kNames[] = {"one", "prime", "odd", "long", "bench_small", "bench_medium"};
  return kNames[static_cast<int>(s)];
}
inline const char* value_name(ValueClass v) {
  static const char* const kNames[] = {"ordinary", "zeros", "subnormals", "large", "nonfinite"};
  return kNames[static_cast<int>(v)];
}

struct CaseSpec {
  SizeClass size = SizeClass::kPrime;
  ValueClass values = ValueClass::kOrdinary;
  uint64_t seed = 1;
};

// Draws a case's inputs.
class Draw {
 public:
  explicit Draw(const CaseSpec& spec) : spec_(spec), rng_(spec.seed) {}

  // n values of the case's class; large values have magnitudes in [2^(big_exp−1), 2^big_exp)
  // (0: the operand takes none, e.g. the weights beside large activations). A nonfinite case puts
  // one NaN or ±inf in the operand asked with `nonfinite`.
  std::vector<float> values(int64_t n, int big_exp = 0, bool nonfinite = false) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = value(big_exp);
    if (nonfinite && spec_.values == ValueClass::kNonFinite && n > 0) {
      const float pick[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
      v[below(static_cast<uint64_t>(n))] = pick[below(3)];
    }
    return v;
  }
  // n positive values (variances, learning-rate-like scalars): ordinary magnitudes.
  std::vector<float> positive(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = std::fabs(ordinary()) + 0x1p-8f;
    return v;
  }
  std::vector<int32_t> ints(int64_t n, int32_t below_value) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(below(static_cast<uint64_t>(below_value)));
    return v;
  }
  uint64_t below(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }

 private:
  // Dyadic m·2^(e−20), |m| <= 2^20, e in [−3, 3]: exact in fp32 and in the references.
  float ordinary() {
    const auto m = static_cast<int32_t>(below(1u << 21)) - (1 << 20);
    const int e = static_cast<int>(below(7)) - 3;
    return std::ldexp(static_cast<float>(m), e - 20);
  }
  float value(int big_exp) {
    const uint64_t r = below(8);
    switch (spec_.values) {
      case ValueClass::kZeros:
        if (r < 2) return r == 0 ? 0.0f : -0.0f;
        break;
      case ValueClass::kSubnormals:
        if (r < 2) {
          uint32_t bits = static_cast<uint32_t>(1 + below(0x7fffffu)) | (r == 0 ? 0x80000000u : 0u);
          float x;
          std::memcpy(&x, &bits, sizeof x);
          return x;
        }
        break;
      case ValueClass::kLarge:
        if (r == 0 && big_exp > 0) {
          const float m = 1.0f + static_cast<float>(below(1u << 23)) * 0x1p-23f;
          return std::ldexp(below(2) ? -m : m, big_exp - 1);
        }
        break;
      case ValueClass::kOrdinary:
      case ValueClass::kNonFinite:
        break;
    }
    return ordinary();
  }
  CaseSpec spec_;
  std::mt19937_64 rng_;
};

// One output of the op against its references. `got` is the backend's; `bounded` always, `exact`
// in canonical mode only.
struct Check {
  std::string what;
  std::vector<float> got;
  std::vector<reference::Bounded<double>> bounded;
  std::vector<float> exact;
};

class OpCase {
 public:
  virtual ~OpCase() = default;
  // "N=7 IC=61 OC=13"
  virtual std::string shape() const = 0;
  // The op on the case's inputs: outputs into the case's buffers. Runs once before checks();
  // a benchmark runs it repeatedly (in-place ops then work on their own previous outputs).
  virtual void run(Backend& be, Mode mode) = 0;
  // The backend's outputs of the one run() against the references in `mode`.
  virtual std::vector<Check> checks(Mode mode) const = 0;
  // Floating-point operations of one run (the benchmarks' FLOP/s counter; 0: not counted), and
  // the bytes a memory-bound op reads and writes (bytes/s; each fp32 element once, 4 bytes).
  virtual double flops() const { return 0; }
  virtual double bytes() const { return 0; }
};

// Smallest magnitude that rounds to infinity in fp32 (round to nearest even): 2^128 − 2^103.
inline constexpr double kF32OverflowThreshold = 0x1.ffffffp127;

// got within the Bounded reference: where the reference interval lies wholly at or beyond the fp32
// overflow threshold the kernel must give that infinity, where it straddles it the infinity is
// accepted; non-finite reference values must be matched exactly (NaN by NaN); a NaN or infinite
// bound (an operand's bound already infinite) accepts any finite result and is counted in
// *vacuous.
inline verify::CompareReport compare_bounded(const float* got, const reference::Bounded<double>* want, int64_t n,
                                             int64_t* vacuous = nullptr) {
  std::vector<double> value(static_cast<size_t>(n)), bound(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double w = want[i].value, b = want[i].err;
    if (std::isnan(b) || b == INFINITY) {
      b = INFINITY;
      if (vacuous != nullptr) ++*vacuous;
    }
    if (std::isfinite(w)) {
      const double inf = w > 0 ? INFINITY : -INFINITY;
      if (std::fabs(w) - b >= kF32OverflowThreshold) {
        w = inf;
      } else if (std::fabs(w) + b >= kF32OverflowThreshold && got[i] == inf) {
        w = inf;
      }
    }
    value[static_cast<size_t>(i)] = w;
    bound[static_cast<size_t>(i)] = b;
  }
  return verify::compare_within(got, value.data(), bound.data(), n);
}

// Conversions between the kernels' fp32 buffers and the reference scalars.
template <class Real>
std::vector<Real> as(const std::vector<float>& x) {
  return std::vector<Real>(x.begin(), x.end());
}
inline std::vector<float> floats(const std::vector<reference::CanonicalF32>& x) {
  std::vector<float> r;
  r.reserve(x.size());
  for (const auto& v : x) r.push_back(v.v);
  return r;
}

inline std::string dims_text(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::ostringstream os;
  for (const auto& [name, v] : dims) os << (os.tellp() > 0 ? " " : "") << name << "=" << v;
  return os.str();
}

// Where a kernel writes a parameter gradient in `mode`: an fp32 buffer (fast, `+=`) or an exact
// accumulator rounded once when read (canonical).
struct GradBuffer {
  explicit GradBuffer(int64_t n) : f32(static_cast<size_t>(n), 0.0f), exact(static_cast<size_t>(n)) {}
  GradSink sink(Mode mode) { return mode == Mode::kCanonical ? GradSink{nullptr, &exact, 0} : GradSink{f32.data(), nullptr, 0}; }
  std::vector<float> values(Mode mode) const {
    if (mode == Mode::kFast) return f32;
    std::vector<float> out(exact.size());
    exact.round_to(out.data());
    return out;
  }
  std::vector<float> f32;
  ExactAccumulator exact;
};

}  // namespace lockstep::test
