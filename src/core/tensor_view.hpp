// A tensor as ops and observers see it: data, element type, shape and strides, owning nothing.
// Shapes hold their dims inline (at most kMaxRank), so making a view allocates nothing: views are
// made per op and per observed tensor in the steady-state step. fp32, bf16, fp16 and the fp8
// formats share the one DType (dtype.hpp) with messages and checkpoints.
// Not here: owning buffers (each layer owns its activations), conversions (formats.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"

namespace lockstep {

inline constexpr int kMaxRank = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}
  explicit Shape(std::span<const int64_t> dims) : rank_(static_cast<int>(dims.size())) {
    LS_CHECK(dims.size() <= kMaxRank, "a tensor of rank ", dims.size(), " (at most ", kMaxRank, ")");
    for (size_t i = 0; i < dims.size(); ++i) d_[i] = dims[i];
  }
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return d_[static_cast<size_t>(i)]; }
  std::span<const int64_t> dims() const { return {d_.data(), static_cast<size_t>(rank_)}; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= d_[static_cast<size_t>(i)];
    return n;
  }

 private:
  std::array<int64_t, kMaxRank> d_{};
  int rank_ = 0;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements

  // A row-major view of contiguous data.
  static TensorView contiguous(void* data, DType dtype, Shape shape) {
    std::array<int64_t, kMaxRank> s{};
    int64_t step = 1;
    for (int i = shape.rank() - 1; i >= 0; --i) {
      s[static_cast<size_t>(i)] = step;
      step *= shape[i];
    }
    return {data, dtype, shape, Shape(std::span<const int64_t>(s.data(), static_cast<size_t>(shape.rank())))};
  }
  int64_t numel() const { return shape.numel(); }
  bool is_contiguous() const {
    int64_t step = 1;
    for (int i = shape.rank() - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != step) return false;
      step *= shape[i];
    }
    return true;
  }
  // The data as T, checked against the view's dtype (fp32 paths take f32()).
  template <class T>
  T* as() const {
    LS_CHECK(dtype == dtype_of<T>(), "a ", dtype_name(dtype), " tensor read as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
  float* f32() const { return as<float>(); }
};

}  // namespace lockstep
