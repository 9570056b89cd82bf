// GPU casts (kernels/cuda/cast.cu) against the CPU functions of src/core/formats.hpp, bit for bit:
// fp32 -> bf16/fp16/e4m3/e5m2 with RNE and stochastic rounding (both fp8 saturation modes) over a
// sample of fp32 patterns that covers every exponent, plus every narrow value and its fp32
// neighbours; and widening of every bf16/fp16/fp8 pattern. The CPU functions themselves are
// checked against MPFR in tests/unit/core/test_formats.cpp. Skips without a GPU.
#include "kernels/cuda/cast.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "src/core/philox.hpp"

namespace lockstep::cuda {
namespace {

// Without a GPU (or a driver) cudaGetDeviceCount returns an error rather than 0.
bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define LS_TEST_CUDA(call)                                                  \
  do {                                                                      \
    const cudaError_t err_ = (call);                                        \
    ASSERT_EQ(err_, cudaSuccess) << #call ": " << cudaGetErrorString(err_); \
  } while (0)

struct FormatCase {
  DType dtype;
  int bytes;
  bool fp8;
  uint32_t (*rne)(float, Saturation);
  uint32_t (*sr)(float, uint32_t, Saturation);
  float (*widen)(uint32_t);
};

const FormatCase kCases[] = {
    {DType::kBF16, 2, false, [](float x, Saturation) { return uint32_t{bf16_from_f32(x)}; },
     [](float x, uint32_t r, Saturation) { return uint32_t{bf16_from_f32_sr(x, r)}; },
     [](uint32_t c) { return bf16_to_f32(static_cast<uint16_t>(c)); }},
    {DType::kF16, 2, false, [](float x, Saturation) { return uint32_t{f16_from_f32(x)}; },
     [](float x, uint32_t r, Saturation) { return uint32_t{f16_from_f32_sr(x, r)}; },
     [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); }},
    {DType::kE4M3, 1, true, [](float x, Saturation s) { return uint32_t{e4m3_from_f32(x, s)}; },
     [](float x, uint32_t r, Saturation s) { return uint32_t{e4m3_from_f32_sr(x, r, s)}; },
     [](uint32_t c) { return e4m3_to_f32(static_cast<uint8_t>(c)); }},
    {DType::kE5M2, 1, true, [](float x, Saturation s) { return uint32_t{e5m2_from_f32(x, s)}; },
     [](float x, uint32_t r, Saturation s) { return uint32_t{e5m2_from_f32_sr(x, r, s)}; },
     [](uint32_t c) { return e5m2_to_f32(static_cast<uint8_t>(c)); }},
};

// 2^24 fp32 patterns stepping through all exponents and signs with varied low bits, then every
// bf16 and fp16 value (which include every fp8 value) and the fp32 values next to each.
std::vector<float> sample_inputs() {
  std::vector<float> xs;
  for (uint32_t i = 0; i < (1u << 24); ++i) xs.push_back(f32_from_bits(i * 256u + i % 251u));
  for (uint32_t c = 0; c < (1u << 16); ++c) {
    for (float w : {bf16_to_f32(static_cast<uint16_t>(c)), f16_to_f32(static_cast<uint16_t>(c))}) {
      xs.push_back(w);
      xs.push_back(std::nextafter(w, -std::numeric_limits<float>::infinity()));
      xs.push_back(std::nextafter(w, std::numeric_limits<float>::infinity()));
    }
  }
  return xs;
}

uint32_t code_at(const std::vector<uint8_t>& bytes, int width, size_t i) {
  if (width == 1) return bytes[i];
  uint16_t c;
  std::memcpy(&c, bytes.data() + 2 * i, 2);
  return c;
}

// Runs one GPU narrowing and compares every element with `expected(i)`.
template <class Launch, class Expected>
void expect_narrowing_matches(const FormatCase& f, const char* what, const float* d_in,
                              const std::vector<float>& xs, Launch launch, Expected expected) {
  const size_t n = xs.size();
  void* d_out = nullptr;
  LS_TEST_CUDA(cudaMalloc(&d_out, n * f.bytes));
  launch(d_out);
  LS_TEST_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> out(n * f.bytes);
  LS_TEST_CUDA(cudaMemcpy(out.data(), d_out, out.size(), cudaMemcpyDeviceToHost));
  LS_TEST_CUDA(cudaFree(d_out));
  int mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t got = code_at(out, f.bytes, i), want = expected(i);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << dtype_name(f.dtype) << " " << what << ": element " << i << " x = " << xs[i]
                    << " (0x" << std::hex << f32_bits(xs[i]) << "): GPU 0x" << got << ", CPU 0x"
                    << want << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0) << dtype_name(f.dtype) << " " << what;
}

TEST(CudaCast, NarrowingMatchesCpuBitwise) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> xs = sample_inputs();
  const size_t n = xs.size();
  float* d_in = nullptr;
  LS_TEST_CUDA(cudaMalloc(&d_in, n * sizeof(float)));
  LS_TEST_CUDA(cudaMemcpy(d_in, xs.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const SrKey key{0x5eed5eed12345678ull, 17, 3};
  const uint64_t first_index = (uint64_t{1} << 33) + 5;  // a shard deep inside a large tensor
  for (const FormatCase& f : kCases) {
    for (Saturation sat : {Saturation::kSaturate, Saturation::kNonSaturating}) {
      if (!f.fp8 && sat == Saturation::kSaturate) continue;  // bf16/fp16 have one (IEEE) mode
      expect_narrowing_matches(
          f, sat == Saturation::kSaturate ? "RNE saturating" : "RNE", d_in, xs,
          [&](void* d_out) { cast_f32_to_rne(d_out, d_in, static_cast<int64_t>(n), f.dtype, sat, nullptr); },
          [&](size_t i) { return f.rne(xs[i], sat); });
      expect_narrowing_matches(
          f, sat == Saturation::kSaturate ? "SR saturating" : "SR", d_in, xs,
          [&](void* d_out) {
            cast_f32_to_sr(d_out, d_in, static_cast<int64_t>(n), f.dtype, sat, key, first_index, nullptr);
          },
          [&](size_t i) {
            return f.sr(xs[i], sr_bits(key.seed, key.tensor_id, key.step, first_index + i), sat);
          });
    }
  }
  LS_TEST_CUDA(cudaFree(d_in));
}

TEST(CudaCast, WideningMatchesCpuBitwiseForEveryPattern) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const FormatCase& f : kCases) {
    const size_t n = size_t{1} << (8 * f.bytes);
    std::vector<uint8_t> codes(n * f.bytes);
    for (size_t c = 0; c < n; ++c) {
      if (f.bytes == 1) {
        codes[c] = static_cast<uint8_t>(c);
      } else {
        const auto v = static_cast<uint16_t>(c);
        std::memcpy(codes.data() + 2 * c, &v, 2);
      }
    }
    void* d_in = nullptr;
    float* d_out = nullptr;
    LS_TEST_CUDA(cudaMalloc(&d_in, codes.size()));
    LS_TEST_CUDA(cudaMalloc(&d_out, n * sizeof(float)));
    LS_TEST_CUDA(cudaMemcpy(d_in, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    cast_to_f32(d_out, d_in, static_cast<int64_t>(n), f.dtype, nullptr);
    LS_TEST_CUDA(cudaDeviceSynchronize());
    std::vector<float> out(n);
    LS_TEST_CUDA(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    LS_TEST_CUDA(cudaFree(d_in));
    LS_TEST_CUDA(cudaFree(d_out));
    int mismatches = 0;
    for (size_t c = 0; c < n; ++c) {
      const uint32_t got = f32_bits(out[c]), want = f32_bits(f.widen(static_cast<uint32_t>(c)));
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << dtype_name(f.dtype) << " pattern 0x" << std::hex << c << ": GPU 0x" << got
                      << ", CPU 0x" << want << std::dec;
      }
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(f.dtype);
  }
}

TEST(CudaCast, UnsupportedFormatIsRejected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  EXPECT_THROW(cast_to_f32(nullptr, nullptr, 1, DType::kI32, nullptr), InternalError);
}

}  // namespace
}  // namespace lockstep::cuda
