// Element types of tensors — in memory (views), in messages (src/comm), in checkpoints and dumps —
// and their names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "src/core/check.hpp"

namespace lockstep {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kE4M3, kE5M2, kE8M0, kI32, kI64, kU8, kU16, kU64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kU16: return 2;
    case DType::kE4M3: case DType::kE5M2: case DType::kE8M0: case DType::kU8: return 1;
  }
  return 0;
}

// Names as numpy/safetensors users know them; fp8 formats by their OCP names.
inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kE8M0: return "e8m0";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kU16: return "u16";
    case DType::kU64: return "u64";
  }
  return "?";
}

inline DType dtype_from_name(std::string_view name) {
  for (auto t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2,
                 DType::kE8M0, DType::kI32, DType::kI64, DType::kU8, DType::kU16, DType::kU64}) {
    if (dtype_name(t) == name) return t;
  }
  throw DataError(str_cat("unknown dtype '", name, "' (expected one of f32 f64 bf16 f16 e4m3 e5m2 e8m0 i32 i64 u8 u16 u64)"));
}

// The DType of a C++ element type.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::kU16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::kU64; }
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }

}  // namespace lockstep
