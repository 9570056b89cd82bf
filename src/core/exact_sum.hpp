// Exact summation of fp32 values, rounded once.
//
// Canonical mode (kernels/ops/canonical.hpp) reduces every sum in fixed chunks; the chunk partials
// are fp32 values whose *exact* sum is rounded once to fp32. This file provides that exact sum:
//
//  - add_exact(s, p): the fast path. A double holds any sum of fp32 values exactly as long as the
//    bits span at most 53 positions; TwoSum tells whether the addition was exact. It almost always
//    is (partials of one reduction have similar magnitudes).
//  - SuperAccumulator: the slow path, a Kulisch-style fixed-point accumulator over bit positions
//    [-160, 224) in 32-bit digits carried in int64, so it is exact for any sum of up to 2^31 fp32
//    values (or doubles that are themselves exact sums of fp32 values) and any order.
//  - ExactAccumulator: one exact running sum per element of a buffer (e.g. a parameter gradient
//    accumulated over chunks of tokens, micro-batches and data-parallel ranks): the double fast
//    path per element, spilling to a SuperAccumulator for the rare element where a sum was inexact.
//
// Because the result is RN(exact sum), it does not depend on the order of the additions, the
// number of threads or ranks, or how the chunks were split between them.
// Not here: chunking and the chains inside a chunk (kernels/ops/canonical.hpp); collectives.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "src/core/host_device.hpp"

namespace lockstep {

namespace detail {

// Bit scans of a non-zero word; the GCC builtins do not exist in CUDA device code.
LS_HOST_DEVICE inline int ctz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return __builtin_ctzll(v);
#endif
}

LS_HOST_DEVICE inline int clz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(v));
#else
  return __builtin_clzll(v);
#endif
}

}  // namespace detail

// The rounding error of t = RN(a + b) for finite operands (TwoSum, Knuth): 0 iff t is exact.
LS_HOST_DEVICE inline double two_sum_error(double a, double b, double t) {
  const double bp = t - a;
  const double ap = t - bp;
  return (a - ap) + (b - bp);
}

// s += p if the double sum is exact (or either operand is not finite, which then simply
// propagates); returns false and leaves s unchanged otherwise.
LS_HOST_DEVICE inline bool add_exact(double& s, double p) {
  const double t = s + p;
  if (!(std::isfinite(s) && std::isfinite(p))) {
    s = t;
    return true;
  }
  if (two_sum_error(s, p, t) != 0.0) return false;
  s = t;
  return true;
}

__extension__ typedef unsigned __int128 UInt128;  // GCC/Clang/nvcc; -Wpedantic-clean

class SuperAccumulator {
 public:
  static constexpr int kLowBit = -160;  // weight of bit 0 of digit 0 (below fp32's 2^-149)
  static constexpr int kDigits = 12;    // 12 x 32 bits: positions [-160, 224)
  static constexpr int kDigitBits = 32;

  LS_HOST_DEVICE SuperAccumulator() { clear(); }

  LS_HOST_DEVICE void clear() {
    for (auto& d : digit_) d = 0;
    nan_ = pos_inf_ = neg_inf_ = false;
    adds_ = 0;
  }

  // Adds a finite double that is a multiple of 2^-160 and below 2^190 in magnitude (true of fp32
  // values and of exact sums of up to 2^31 of them); non-finite values are tracked by flag. Any
  // other double (which no exact sum of fp32 values is, but a corrupted message may hold) cannot be
  // held exactly: the sum becomes NaN.
  LS_HOST_DEVICE void add(double x) {
    if (x == 0.0) return;
    if (std::isnan(x)) { nan_ = true; return; }
    if (std::isinf(x)) { (x > 0 ? pos_inf_ : neg_inf_) = true; return; }
    int exp = 0;
    const double frac = std::frexp(std::fabs(x), &exp);          // |x| = frac * 2^exp, frac in [0.5,1)
    auto mant = static_cast<uint64_t>(std::ldexp(frac, 53));     // exact: 53-bit integer
    const int tz = detail::ctz64(mant);                          // drop trailing zeros so that
    mant >>= tz;                                                 // tiny values stay in range
    const int shift = exp - 53 + tz - kLowBit;                   // bit position of mant's lsb
    if (shift < 0 || exp > kLowBit + kDigits * kDigitBits - 34) { nan_ = true; return; }
    const int idx = shift / kDigitBits;
    const int off = shift % kDigitBits;
    // mant << off spans at most 53 + 31 bits: three 32-bit digits, from a 64-bit low part and
    // the bits shifted out of it (ISO C++ and CUDA device code have no portable 128-bit type).
    const uint64_t lo = mant << off;
    const uint64_t hi = off == 0 ? 0 : mant >> (64 - off);
    const uint64_t pieces[3] = {lo & 0xffffffffu, lo >> 32, hi};
    const int64_t sign = x < 0 ? -1 : 1;
    for (int k = 0; k < 3 && idx + k < kDigits; ++k) {
      digit_[idx + k] += sign * static_cast<int64_t>(pieces[k]);
    }
    // Each add moves a digit by < 2^32; normalise long before an int64 digit could overflow.
    if (++adds_ == (1u << 30)) normalize();
  }

  LS_HOST_DEVICE void add(const SuperAccumulator& o) {
    // Normalise first: both sides may carry up to 2^30 unnormalised adds (digits near 2^62), and
    // their sum would overflow int64; a normalised digit is below 2^32.
    normalize();
    for (int i = 0; i < kDigits; ++i) digit_[i] += o.digit_[i];
    nan_ |= o.nan_;
    pos_inf_ |= o.pos_inf_;
    neg_inf_ |= o.neg_inf_;
    normalize();
  }

  // The exact sum rounded to nearest-even fp32 (overflow gives ±inf, tiny sums round into the
  // subnormals exactly as an fp32 addition would). An exactly zero sum is +0, whatever the signs
  // of zero that were added (IEEE's x + (-x) = +0 under round-to-nearest).
  LS_HOST_DEVICE float round_to_float() const {
    if (nan_ || (pos_inf_ && neg_inf_)) return std::numeric_limits<float>::quiet_NaN();
    if (pos_inf_) return std::numeric_limits<float>::infinity();
    if (neg_inf_) return -std::numeric_limits<float>::infinity();
    SuperAccumulator m = *this;
    m.normalize();
    bool negative = m.digit_[kDigits - 1] < 0;
    if (negative) {
      for (auto& d : m.digit_) d = -d;
      m.normalize();
    }
    int top = -1;  // highest set bit index (relative to kLowBit)
    for (int i = kDigits - 1; i >= 0 && top < 0; --i) {
      if (m.digit_[i] != 0) top = i * kDigitBits + 63 - detail::clz64(static_cast<uint64_t>(m.digit_[i]));
    }
    if (top < 0) return negative ? -0.0f : 0.0f;
    const int lead = top + kLowBit;               // exponent of the leading bit
    int q = std::max(lead - 23, -149);            // exponent of the result's ulp
    uint64_t mant = 0;
    for (int p = lead; p >= q; --p) mant = (mant << 1) | m.bit(p);
    const bool round = m.bit(q - 1);
    bool sticky = false;
    for (int p = q - 2; p >= kLowBit && !sticky; --p) sticky = m.bit(p);
    if (round && (sticky || (mant & 1))) {
      ++mant;
      if (mant == (uint64_t{1} << 24)) { mant >>= 1; ++q; }
    }
    float r;
    if (q + 23 > 127) {
      r = std::numeric_limits<float>::infinity();
    } else {
      r = static_cast<float>(std::ldexp(static_cast<double>(mant), q));  // exact
    }
    return negative ? -r : r;
  }

  // Digits as stored (carry-save); exposed so that collectives can sum them as integers.
  LS_HOST_DEVICE const int64_t* digits() const { return digit_; }

  // The non-finite values added, as bits; with digits() this is the whole state, e.g. for sending
  // an accumulator to another rank and rebuilding it there with from_digits().
  static constexpr uint8_t kNaN = 1, kPosInf = 2, kNegInf = 4;
  LS_HOST_DEVICE uint8_t flags() const {
    return static_cast<uint8_t>((nan_ ? kNaN : 0) | (pos_inf_ ? kPosInf : 0) | (neg_inf_ ? kNegInf : 0));
  }

  // The accumulator whose digits() (kDigits of them, as stored) and flags() these are.
  LS_HOST_DEVICE static SuperAccumulator from_digits(const int64_t* digits, uint8_t flags) {
    SuperAccumulator a;
    for (int i = 0; i < kDigits; ++i) a.digit_[i] = digits[i];
    a.nan_ = (flags & kNaN) != 0;
    a.pos_inf_ = (flags & kPosInf) != 0;
    a.neg_inf_ = (flags & kNegInf) != 0;
    a.normalize();  // the source may have carried up to 2^30 unnormalised adds
    return a;
  }

 private:
  LS_HOST_DEVICE void normalize() {
    for (int i = 0; i < kDigits - 1; ++i) {
      const int64_t carry = digit_[i] >> kDigitBits;  // floor division: digit becomes [0, 2^32)
      digit_[i] -= carry * (int64_t{1} << kDigitBits);
      digit_[i + 1] += carry;
    }
    adds_ = 0;
  }
  // Bit at absolute position p of a normalised, non-negative accumulator.
  LS_HOST_DEVICE int bit(int p) const {
    const int rel = p - kLowBit;
    if (rel < 0 || rel >= kDigits * kDigitBits) return 0;
    return static_cast<int>((digit_[rel / kDigitBits] >> (rel % kDigitBits)) & 1);
  }

  int64_t digit_[kDigits];
  bool nan_, pos_inf_, neg_inf_;
  uint32_t adds_;
};

// One exact running sum per element. add() is safe from several threads for distinct elements.
// Invariant: element i's exact sum is partial_sums()[i] while !spilled(i), and spill(i) (which
// includes the double it held when it spilled) once spilled(i); an element never un-spills until
// zero() or reset().
class ExactAccumulator {
 public:
  ExactAccumulator() = default;
  explicit ExactAccumulator(size_t n) : sum_(n, 0.0), spilled_(n, 0) {}

  size_t size() const { return sum_.size(); }

  // Re-creates the accumulator for n elements, all zero.
  void reset(size_t n) {
    sum_.assign(n, 0.0);
    spilled_.assign(n, 0);
    std::lock_guard<std::mutex> lock(mutex_);
    spill_.clear();
  }

  void zero() { zero(0, sum_.size()); }
  // Elements [first, end) back to zero, their spills dropped. Safe from several threads for
  // disjoint ranges (a memory-bound pass: callers split a large accumulator over threads).
  void zero(size_t first, size_t end) {
    std::fill(sum_.begin() + static_cast<std::ptrdiff_t>(first),
              sum_.begin() + static_cast<std::ptrdiff_t>(end), 0.0);
    std::fill(spilled_.begin() + static_cast<std::ptrdiff_t>(first),
              spilled_.begin() + static_cast<std::ptrdiff_t>(end), uint8_t{0});
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(spill_, [&](const auto& kv) { return kv.first >= first && kv.first < end; });
  }

  void add(size_t i, double partial) {
    if (!spilled_[i] && add_exact(sum_[i], partial)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    SuperAccumulator& acc = spill_[i];
    if (!spilled_[i]) {
      acc.add(sum_[i]);
      spilled_[i] = 1;
    }
    acc.add(partial);
  }

  // add(i0 + k, p[k]) for k < n. Where no element of the run has spilled and every double
  // addition is exact (add_exact's TwoSum test, lane by lane; a non-finite operand fails it) the
  // whole run is added at once — loops without a branch per element, which vectorise (the tests
  // OR-reduced into integers: GCC leaves a `bool &=` of a comparison scalar) — and otherwise
  // element by element through add(). Same results as n calls of add().
  void add_run(size_t i0, const float* p, size_t n) {
    double* s = sum_.data() + i0;
    const uint8_t* spilled = spilled_.data() + i0;
    int64_t inexact = 0;
    for (size_t k = 0; k < n; ++k) {
      const double a = s[k], b = p[k];
      inexact |= two_sum_error(a, b, a + b) != 0.0 ? 1 : 0;
    }
    unsigned any_spilled = 0;
    for (size_t k = 0; k < n; ++k) any_spilled |= spilled[k];
    if (inexact == 0 && any_spilled == 0) {
      for (size_t k = 0; k < n; ++k) s[k] = s[k] + static_cast<double>(p[k]);
      return;
    }
    for (size_t k = 0; k < n; ++k) add(i0 + k, p[k]);
  }

  float round(size_t i) const {
    if (!spilled_[i]) return static_cast<float>(sum_[i]);  // exact double -> one rounding
    std::lock_guard<std::mutex> lock(mutex_);
    return spill_.at(i).round_to_float();
  }

  void round_to(float* out) const { round_to(0, sum_.size(), out); }
  // Elements [first, end), rounded, to out[0 .. end - first): every double converted in one loop
  // (it vectorises: no element's branch), then the few spilled elements overwritten with their
  // exact sums' rounding (the stale doubles they got are never kept). Safe from several threads
  // for disjoint ranges.
  void round_to(size_t first, size_t end, float* out) const {
    const double* sum = sum_.data();
    for (size_t i = first; i < end; ++i) out[i - first] = static_cast<float>(sum[i]);
    std::lock_guard<std::mutex> lock(mutex_);
    if (spill_.size() <= end - first) {  // the usual case: few spills, visited through the map
      for (const auto& [i, acc] : spill_) {
        if (i >= first && i < end) out[i - first] = acc.round_to_float();
      }
      return;
    }
    for (size_t i = first; i < end; ++i) {
      if (spilled_[i]) out[i - first] = spill_.at(i).round_to_float();
    }
  }

  size_t spill_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spill_.size();
  }

  // Adds an exact sum held in a SuperAccumulator (e.g. another rank's spill of element i); the
  // element spills. Safe from several threads for distinct elements, as add(i, double).
  void add(size_t i, const SuperAccumulator& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    SuperAccumulator& acc = spill_[i];
    if (!spilled_[i]) {
      acc.add(sum_[i]);
      spilled_[i] = 1;
    }
    acc.add(s);
  }

  // Read access to the state (e.g. to send it to other ranks); not safe while another thread
  // adds, zeroes or resets. partial_sums()[i] is element i's exact sum where !spilled(i); where
  // spilled(i) it is stale (already included in spill(i)) and spill(i) holds the sum.
  const double* partial_sums() const { return sum_.data(); }
  bool spilled(size_t i) const { return spilled_[i] != 0; }
  // For vector kernels that perform add(i, p)'s fast path themselves on a run of elements: they
  // may store s + p into partial_sums_to_add()[i] only where !spilled(i) and the double addition
  // is exact (add_exact's test), and must call add(i, p) for every other element. Same rules for
  // threads as add().
  double* partial_sums_to_add() { return sum_.data(); }
  const uint8_t* spill_flags() const { return spilled_.data(); }
  const SuperAccumulator& spill(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spill_.at(i);
  }

 private:
  std::vector<double> sum_;
  std::vector<uint8_t> spilled_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, SuperAccumulator> spill_;
};

}  // namespace lockstep
