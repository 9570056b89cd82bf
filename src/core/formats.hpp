// Numeric formats: bf16, fp16, fp8 E4M3 / E5M2 (OCP OFP8 rev 1.0) and E8M0 (OCP MX v1.0 scale),
// stored as raw bit patterns (uint16_t / uint8_t), and their conversions to and from fp32.
//
//  - Widening to fp32 is exact for every pattern (all of these formats are subsets of fp32).
//  - Narrowing from fp32 rounds to nearest, ties to even (RNE), or stochastically: a uniform random
//    32-bit word is added below the kept precision and the sum truncated (src/core/philox.hpp
//    supplies the word from the element's global index). Subnormals of the target are produced
//    exactly; fp32 subnormal inputs are handled like any other value.
//  - fp8 narrowing has two named modes (Saturation): kSaturate maps every out-of-range finite value
//    and ±inf to ±max finite, kNonSaturating maps them to NaN (E4M3, which has no inf) or ±inf
//    (E5M2). bf16 and fp16 follow IEEE 754: overflow gives ±inf.
//  - NaN stays NaN and keeps its sign; narrowing returns the format's canonical quiet NaN
//    (exponent all ones, top mantissa bit set; S.1111.111 for E4M3; 0xFF for E8M0) and widening
//    returns a quiet fp32 NaN carrying the mantissa bits. NaN payloads are otherwise not kept.
//
// Every function is usable from host and CUDA device code; the CUDA cast kernels
// (kernels/cuda/cast.cu) call these very functions, so CPU and GPU results agree bit for bit.
// Not here: tensors of these types, MX/blockwise scaling (kernels), random bits (philox.hpp).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include "src/core/host_device.hpp"

namespace lockstep {

// ---- format properties, for deriving bounds (docs/numerics.md, "Formats") ----

struct FormatInfo {
  const char* name;
  int bits;            // storage width
  int exp_bits;
  int man_bits;        // explicit (stored) mantissa bits; precision is man_bits + 1
  int bias;
  bool has_inf;
  double unit_roundoff;  // u = 2^-(man_bits+1); NaN for E8M0, which has no mantissa to round
  double max_finite;
  double min_normal;
  double min_subnormal;  // smallest positive value (E8M0 has no subnormals: equals min_normal)
};

namespace detail {

constexpr double exp2i(int e) {
  double r = 1.0;
  for (; e > 0; --e) r *= 2.0;
  for (; e < 0; ++e) r *= 0.5;
  return r;
}

// Largest exponent of a finite value. IEEE-like formats reserve the all-ones exponent for inf and
// NaN; E4M3 ("FN") reserves only S.1111.111, so its all-ones exponent holds finite values.
constexpr FormatInfo make_info(const char* name, int exp_bits, int man_bits, bool ieee_specials) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int emax = ieee_specials ? (1 << exp_bits) - 2 - bias : (1 << exp_bits) - 1 - bias;
  const double top = ieee_specials ? 2.0 - exp2i(-man_bits) : 2.0 - exp2i(1 - man_bits);
  return FormatInfo{name,  1 + exp_bits + man_bits,    exp_bits,           man_bits,
                    bias,  ieee_specials,              exp2i(-man_bits - 1), top * exp2i(emax),
                    exp2i(1 - bias), exp2i(1 - bias - man_bits)};
}

}  // namespace detail

inline constexpr FormatInfo kF32Info = detail::make_info("f32", 8, 23, true);
inline constexpr FormatInfo kBF16Info = detail::make_info("bf16", 8, 7, true);
inline constexpr FormatInfo kF16Info = detail::make_info("f16", 5, 10, true);
inline constexpr FormatInfo kE4M3Info = detail::make_info("e4m3", 4, 3, false);
inline constexpr FormatInfo kE5M2Info = detail::make_info("e5m2", 5, 2, true);
// E8M0: unsigned, value 2^(e-127) for e in [0, 254], 0xFF = NaN.
inline constexpr FormatInfo kE8M0Info{"e8m0", 8, 8, 0, 127, false,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      detail::exp2i(127), detail::exp2i(-127), detail::exp2i(-127)};

// What narrowing does with finite values beyond max finite, and with ±inf (fp8 only).
enum class Saturation : uint8_t {
  kSaturate,       // -> ±max finite
  kNonSaturating,  // -> NaN (E4M3) or ±inf (E5M2)
};

// The two fp8 formats of the FP8 recipes, and how a recipe scales a tensor before narrowing to
// one (kernels/ops/quantize.hpp has the rules): one caller-given scale for the whole tensor, or
// one per block from the block's amax, as fp32 (fp8_max / amax) or as a power of two.
enum class Fp8Format : uint8_t { kE4M3, kE5M2 };
enum class Fp8Scale : uint8_t { kPerTensor, kFp32, kPowerOfTwo };

inline constexpr const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }
inline constexpr const FormatInfo& fp8_info(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3Info : kE5M2Info; }
inline constexpr float fp8_max(Fp8Format f) { return static_cast<float>(fp8_info(f).max_finite); }

// ---- bit casts usable in device code ----

LS_HOST_DEVICE inline uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}

LS_HOST_DEVICE inline float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}

namespace detail {

// Count of leading zeros of a non-zero word.
LS_HOST_DEVICE inline int clz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return __builtin_clz(v);
#endif
}

// A narrow binary format: kExp exponent bits, kMan mantissa bits, bias 2^(kExp-1)-1, sign bit on
// top. kIeee: all-ones exponent is inf (mantissa 0) or NaN; otherwise only all-ones is NaN.
template <int kExpBits, int kManBits, bool kIeeeSpecials>
struct NarrowFormat {
  static constexpr int kExp = kExpBits;
  static constexpr int kMan = kManBits;
  static constexpr bool kIeee = kIeeeSpecials;
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  static constexpr uint32_t kSignBit = uint32_t{1} << (kExp + kMan);
  static constexpr uint32_t kExpMask = ((uint32_t{1} << kExp) - 1) << kMan;
  static constexpr uint32_t kManMask = (uint32_t{1} << kMan) - 1;
  static constexpr uint32_t kInf = kExpMask;  // meaningful only when kIeee
  static constexpr uint32_t kNaN = kIeee ? kExpMask | (uint32_t{1} << (kMan - 1)) : kExpMask | kManMask;
  static constexpr uint32_t kMaxFinite = kIeee ? kExpMask - 1 : (kExpMask | kManMask) - 1;
  static_assert(kMan < 23 && kExp <= 8, "narrow formats only");
};

using Bf16Format = NarrowFormat<8, 7, true>;
using F16Format = NarrowFormat<5, 10, true>;
using E4M3Format = NarrowFormat<4, 3, false>;
using E5M2Format = NarrowFormat<5, 2, true>;

template <class F>
LS_HOST_DEVICE constexpr bool is_nan_bits(uint32_t c) {
  const uint32_t a = c & ~F::kSignBit;
  return F::kExpMask == (a & F::kExpMask) && (F::kIeee ? (a & F::kManMask) != 0 : a == (F::kExpMask | F::kManMask));
}

template <class F>
LS_HOST_DEVICE inline float widen(uint32_t c) {
  const uint32_t sign = (c & F::kSignBit) ? 0x80000000u : 0u;
  const uint32_t e = (c & F::kExpMask) >> F::kMan;
  uint32_t m = c & F::kManMask;
  if (is_nan_bits<F>(c)) return f32_from_bits(sign | 0x7fc00000u | (m << (23 - F::kMan)));
  if (F::kIeee && e == (F::kExpMask >> F::kMan)) return f32_from_bits(sign | 0x7f800000u);
  if (e != 0) {  // normal: rebias the exponent, widen the mantissa
    return f32_from_bits(sign | ((e - F::kBias + 127) << 23) | (m << (23 - F::kMan)));
  }
  if (m == 0) return f32_from_bits(sign);
  // Subnormal m * 2^(kEmin - kMan). bf16 shares fp32's exponent range, so its subnormals are fp32
  // subnormals (m * 2^-149 after a shift); the others are fp32 normals: normalise so that the
  // leading bit becomes fp32's implicit bit.
  static_assert(F::kEmin >= -126, "narrow formats have at most fp32's exponent range");
  if constexpr (F::kEmin == -126) return f32_from_bits(sign | (m << (F::kEmin - F::kMan + 149)));
  int shift = 0;
  while (!(m & (uint32_t{1} << F::kMan))) {
    m <<= 1;
    ++shift;
  }
  const uint32_t exp32 = static_cast<uint32_t>(F::kEmin - shift + 127);
  return f32_from_bits(sign | (exp32 << 23) | ((m & F::kManMask) << (23 - F::kMan)));
}

enum class Rounding : uint8_t { kNearestEven, kStochastic };

// Narrows fp32 to F. The finite value |x| = sig * 2^p0 is rounded to a multiple of the target
// quantum 2^q, q = max(floor(log2|x|), kEmin) - kMan, which covers normals and subnormals alike.
// The rounded multiple `kept` then encodes directly as ((max(e, kEmin) + kBias - 1) << kMan) + kept:
// a carry into the next binade (or from the subnormals into the normals) lands in the exponent
// field by itself. Codes above kMaxFinite are overflow.
template <class F, Rounding kMode>
LS_HOST_DEVICE inline uint32_t narrow(float x, Saturation sat, uint32_t random_bits) {
  const uint32_t b = f32_bits(x);
  const uint32_t sign = (b & 0x80000000u) ? F::kSignBit : 0u;
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | F::kNaN;
  const uint32_t overflow =
      sat == Saturation::kSaturate ? F::kMaxFinite : (F::kIeee ? F::kInf : F::kNaN);
  if (a == 0x7f800000u) return sign | overflow;
  if (a == 0) return sign;

  const int e32 = static_cast<int>(a >> 23);
  uint32_t sig = a & 0x7fffffu;
  int p0 = -149;                      // value = sig * 2^p0
  if (e32 != 0) {
    sig |= 0x800000u;
    p0 = e32 - 150;
  }
  const int msb = 31 - clz32(sig);
  const int e = p0 + msb;             // floor(log2|x|)
  const int e_t = e > F::kEmin ? e : F::kEmin;
  const int shift = e_t - F::kMan - p0;  // >= 23 - kMan > 0: there is always something to drop

  uint64_t kept;
  if constexpr (kMode == Rounding::kNearestEven) {
    if (shift > 25) return sign;      // |x| < 2^(q-1): below half the quantum, rounds to zero
    const uint32_t dropped = sig & ((uint32_t{1} << shift) - 1);
    const uint32_t half = uint32_t{1} << (shift - 1);
    kept = sig >> shift;
    if (dropped > half || (dropped == half && (kept & 1))) ++kept;
  } else {
    // Align the dropped bits with the 32 random bits and add: rounds up with probability
    // (dropped part)/quantum exactly when shift <= 32. Beyond that (values below 2^-32 of the
    // target's smallest subnormal) bits under 2^-32 of the quantum are truncated first, a bias
    // below 2^-32 of the smallest subnormal.
    uint64_t scaled;
    if (shift <= 32) {
      scaled = static_cast<uint64_t>(sig) << (32 - shift);
    } else {
      scaled = shift - 32 < 64 ? static_cast<uint64_t>(sig) >> (shift - 32) : 0;
    }
    kept = (scaled + random_bits) >> 32;
  }
  const uint64_t code = (static_cast<uint64_t>(e_t + F::kBias - 1) << F::kMan) + kept;
  if (code > F::kMaxFinite) return sign | overflow;
  return sign | static_cast<uint32_t>(code);
}

}  // namespace detail

// ---- bf16 (IEEE semantics: overflow -> ±inf) ----

LS_HOST_DEVICE inline float bf16_to_f32(uint16_t c) { return detail::widen<detail::Bf16Format>(c); }
LS_HOST_DEVICE inline uint16_t bf16_from_f32(float x) {
  return static_cast<uint16_t>(detail::narrow<detail::Bf16Format, detail::Rounding::kNearestEven>(
      x, Saturation::kNonSaturating, 0));
}
LS_HOST_DEVICE inline uint16_t bf16_from_f32_sr(float x, uint32_t random_bits) {
  return static_cast<uint16_t>(detail::narrow<detail::Bf16Format, detail::Rounding::kStochastic>(
      x, Saturation::kNonSaturating, random_bits));
}

// ---- fp16 (IEEE binary16: overflow -> ±inf) ----

LS_HOST_DEVICE inline float f16_to_f32(uint16_t c) { return detail::widen<detail::F16Format>(c); }
LS_HOST_DEVICE inline uint16_t f16_from_f32(float x) {
  return static_cast<uint16_t>(detail::narrow<detail::F16Format, detail::Rounding::kNearestEven>(
      x, Saturation::kNonSaturating, 0));
}
LS_HOST_DEVICE inline uint16_t f16_from_f32_sr(float x, uint32_t random_bits) {
  return static_cast<uint16_t>(detail::narrow<detail::F16Format, detail::Rounding::kStochastic>(
      x, Saturation::kNonSaturating, random_bits));
}

// ---- fp8 E4M3 (OCP "FN": no inf, NaN = S.1111.111, max 448) ----

LS_HOST_DEVICE inline float e4m3_to_f32(uint8_t c) { return detail::widen<detail::E4M3Format>(c); }
LS_HOST_DEVICE inline uint8_t e4m3_from_f32(float x, Saturation sat) {
  return static_cast<uint8_t>(
      detail::narrow<detail::E4M3Format, detail::Rounding::kNearestEven>(x, sat, 0));
}
LS_HOST_DEVICE inline uint8_t e4m3_from_f32_sr(float x, uint32_t random_bits, Saturation sat) {
  return static_cast<uint8_t>(
      detail::narrow<detail::E4M3Format, detail::Rounding::kStochastic>(x, sat, random_bits));
}

// ---- fp8 E5M2 (IEEE-like inf and NaN, max 57344) ----

LS_HOST_DEVICE inline float e5m2_to_f32(uint8_t c) { return detail::widen<detail::E5M2Format>(c); }
LS_HOST_DEVICE inline uint8_t e5m2_from_f32(float x, Saturation sat) {
  return static_cast<uint8_t>(
      detail::narrow<detail::E5M2Format, detail::Rounding::kNearestEven>(x, sat, 0));
}
LS_HOST_DEVICE inline uint8_t e5m2_from_f32_sr(float x, uint32_t random_bits, Saturation sat) {
  return static_cast<uint8_t>(
      detail::narrow<detail::E5M2Format, detail::Rounding::kStochastic>(x, sat, random_bits));
}

// ---- E8M0 (MX shared scale: 2^(c-127), c in [0, 254]; 0xFF = NaN) ----

inline constexpr uint8_t kE8M0NaN = 0xFF;

LS_HOST_DEVICE inline float e8m0_to_f32(uint8_t c) {
  if (c == kE8M0NaN) return f32_from_bits(0x7fc00000u);
  if (c == 0) return f32_from_bits(0x00400000u);  // 2^-127 is an fp32 subnormal
  return f32_from_bits(static_cast<uint32_t>(c) << 23);
}

// The scale 2^e, clamped to the representable range [2^-127, 2^127]. MX (v1.0, section 6.3)
// computes e = floor(log2(amax)) - emax_elem and clamps; clamping here keeps every caller's scale
// finite and positive.
LS_HOST_DEVICE inline uint8_t e8m0_from_exponent(int e) {
  if (e < -127) return 0;
  if (e > 127) return 0xFE;
  return static_cast<uint8_t>(e + 127);
}

// 2^floor(log2|x|), clamped as in e8m0_from_exponent: the rounding-down rule MX v1.0 uses for the
// shared exponent of a block's amax. Rounding down never enlarges the scale, so amax / scale < 2 and
// the block's largest element keeps its leading bit. ±0 and |x| < 2^-127 give 2^-127 (the smallest
// scale; any scale serves an all-zero block); ±inf and NaN give NaN. The sign of x is ignored.
LS_HOST_DEVICE inline uint8_t e8m0_from_f32_floor(float x) {
  const uint32_t a = f32_bits(x) & 0x7fffffffu;
  if (a >= 0x7f800000u) return kE8M0NaN;
  if (a == 0) return 0;
  const int e32 = static_cast<int>(a >> 23);
  if (e32 != 0) return e8m0_from_exponent(e32 - 127);
  return e8m0_from_exponent(-149 + (31 - detail::clz32(a)));  // fp32 subnormal: position of msb
}

}  // namespace lockstep
