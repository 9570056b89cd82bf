// CUDA casts between fp32 and the narrow formats (see cast.hpp). One thread per element in a
// grid-stride loop; each element is converted by the host/device functions of src/core/formats.hpp.
#include "kernels/cuda/cast.hpp"

#include "src/core/check.hpp"
#include "src/core/philox.hpp"

namespace lockstep::cuda {
namespace {

// One narrow format: its storage type and its three conversions.
struct Bf16Cast {
  using T = uint16_t;
  __device__ static T rne(float x, Saturation) { return bf16_from_f32(x); }
  __device__ static T sr(float x, uint32_t r, Saturation) { return bf16_from_f32_sr(x, r); }
  __device__ static float widen(T c) { return bf16_to_f32(c); }
};
struct F16Cast {
  using T = uint16_t;
  __device__ static T rne(float x, Saturation) { return f16_from_f32(x); }
  __device__ static T sr(float x, uint32_t r, Saturation) { return f16_from_f32_sr(x, r); }
  __device__ static float widen(T c) { return f16_to_f32(c); }
};
struct E4M3Cast {
  using T = uint8_t;
  __device__ static T rne(float x, Saturation s) { return e4m3_from_f32(x, s); }
  __device__ static T sr(float x, uint32_t r, Saturation s) { return e4m3_from_f32_sr(x, r, s); }
  __device__ static float widen(T c) { return e4m3_to_f32(c); }
};
struct E5M2Cast {
  using T = uint8_t;
  __device__ static T rne(float x, Saturation s) { return e5m2_from_f32(x, s); }
  __device__ static T sr(float x, uint32_t r, Saturation s) { return e5m2_from_f32_sr(x, r, s); }
  __device__ static float widen(T c) { return e5m2_to_f32(c); }
};

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // beyond this the grid-stride loop takes over

template <class C>
__global__ void narrow_rne_kernel(typename C::T* out, const float* in, int64_t n, Saturation sat) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = C::rne(in[i], sat);
  }
}

template <class C>
__global__ void narrow_sr_kernel(typename C::T* out, const float* in, int64_t n, Saturation sat,
                                 SrKey key, uint64_t first_index) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t r = sr_bits(key.seed, key.tensor_id, key.step, first_index + static_cast<uint64_t>(i));
    out[i] = C::sr(in[i], r, sat);
  }
}

template <class C>
__global__ void widen_kernel(float* out, const typename C::T* in, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = C::widen(in[i]);
  }
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? b : kMaxBlocks);
}

void check_launch() {
  const cudaError_t err = cudaGetLastError();
  LS_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));
}

// Calls f(C{}) for the cast of `t`.
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: f(Bf16Cast{}); return;
    case DType::kF16: f(F16Cast{}); return;
    case DType::kE4M3: f(E4M3Cast{}); return;
    case DType::kE5M2: f(E5M2Cast{}); return;
    default: break;
  }
  LS_CHECK(false, "cast: unsupported narrow format ", dtype_name(t));
}

}  // namespace

void cast_f32_to_rne(void* out, const float* in, int64_t n, DType to, Saturation sat,
                     cudaStream_t stream) {
  LS_CHECK(n >= 0, "n = ", n);
  if (n == 0) return;
  dispatch(to, [&](auto c) {
    using C = decltype(c);
    narrow_rne_kernel<C><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<typename C::T*>(out), in, n, sat);
  });
  check_launch();
}

void cast_f32_to_sr(void* out, const float* in, int64_t n, DType to, Saturation sat, SrKey key,
                    uint64_t first_index, cudaStream_t stream) {
  LS_CHECK(n >= 0, "n = ", n);
  if (n == 0) return;
  dispatch(to, [&](auto c) {
    using C = decltype(c);
    narrow_sr_kernel<C><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<typename C::T*>(out), in, n, sat,
                                                                key, first_index);
  });
  check_launch();
}

void cast_to_f32(float* out, const void* in, int64_t n, DType from, cudaStream_t stream) {
  LS_CHECK(n >= 0, "n = ", n);
  if (n == 0) return;
  dispatch(from, [&](auto c) {
    using C = decltype(c);
    widen_kernel<C><<<blocks_for(n), kThreads, 0, stream>>>(out, static_cast<const typename C::T*>(in), n);
  });
  check_launch();
}

}  // namespace lockstep::cuda
