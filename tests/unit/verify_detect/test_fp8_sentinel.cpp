// The fp8 sentinel's two measures of a quantization: the kernel's energies (kernels/ops/quantize.hpp:
// the error's energy stays within what rounding may cost unless elements saturate) and the shadow
// check of a GEMM (verify/detect/fp8_sentinel.hpp: a clean quantization stays well within its
// probabilistic bound in every layout of the operands; an operand row lost to zero, or a scale that
// saturates, passes it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "verify/detect/fp8_sentinel.hpp"

namespace lockstep::detect {
namespace {

std::vector<float> normal(int64_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// x quantized per tensor with the current-scaling rule and `extra` times that scale.
struct Quantized {
  std::vector<float> high, q;
  QuantizeShape shape;
  Fp8Counts counts;
};
Quantized quantize(std::vector<float> x, int64_t rows, int64_t cols, Fp8Format f, float extra = 1.0f) {
  CpuBackend cpu = CpuBackend::current();
  float amax = 0;
  cpu.abs_max(rows * cols, &amax, x.data());
  Quantized out{std::move(x), {}, {.rows = rows, .cols = cols, .format = f}, {}};
  out.shape.scale = fp8_scale(amax, f, 0, false, 1.0f) * extra;
  out.q.resize(out.high.size());
  cpu.quantize_fp8(out.shape, out.q.data(), &out.counts, out.high.data());
  return out;
}

TEST(Fp8Energies, WithinWhatRoundingMayCostUnlessSaturated) {
  const Quantized clean = quantize(normal(4096, 1), 64, 64, Fp8Format::kE4M3);
  EXPECT_EQ(clean.counts.saturated, 0);
  EXPECT_GT(clean.counts.err_sq, 0);
  EXPECT_LT(clean.counts.err_sq, clean.counts.bound_sq);
  // Rounding to nearest uses about a third of its worst case's energy (uniform errors).
  EXPECT_GT(clean.counts.err_sq, 0.05 * clean.counts.bound_sq);
  const Quantized saturating = quantize(normal(4096, 1), 64, 64, Fp8Format::kE4M3, 4.0f);
  EXPECT_GT(saturating.counts.saturated, 0);
  EXPECT_GT(saturating.counts.err_sq, saturating.counts.bound_sq);
}

// The relative error of the sampled rows, computed here in double from the operands as stored.
double brute_rel_error(const Fp8GemmView& v, int64_t rows) {
  const auto at = [](const Fp8GemmOperand& o, bool quantized, int64_t r, int64_t c) {
    const float* p = quantized ? o.quantized : o.high;
    return static_cast<double>(o.transposed ? p[c * o.shape.cols + r] : p[r * o.shape.cols + c]);
  };
  double obs_sq = 0, ref_sq = 0;
  const int64_t R = std::min(rows, v.M);
  for (int64_t s = 0; s < R; ++s) {
    const int64_t i = s * v.M / R;
    for (int64_t j = 0; j < v.N; ++j) {
      double obs = 0, ref = 0;
      for (int64_t k = 0; k < v.K; ++k) {
        obs += at(v.a, true, i, k) * at(v.b, true, k, j) - at(v.a, false, i, k) * at(v.b, false, k, j);
        ref += at(v.a, false, i, k) * at(v.b, false, k, j);
      }
      obs_sq += obs * obs;
      ref_sq += ref * ref;
    }
  }
  return std::sqrt(obs_sq / ref_sq);
}

TEST(Fp8GemmCheck, CleanQuantizationStaysWithinItsBoundInEveryLayout) {
  const int64_t M = 24, N = 40, K = 96;
  // fprop: C = A · Bᵀ with B stored (N, K); dgrad: B stored (K, N); wgrad: A stored (K, M).
  const Quantized a = quantize(normal(M * K, 2), M, K, Fp8Format::kE4M3);
  const Quantized at = quantize(normal(K * M, 3), K, M, Fp8Format::kE5M2);
  const Quantized bt = quantize(normal(N * K, 4, 0.02f), N, K, Fp8Format::kE4M3);
  const Quantized b = quantize(normal(K * N, 5, 0.02f), K, N, Fp8Format::kE4M3);
  const std::string name = "layer/0/mlp/fc";
  for (const Fp8GemmView& v :
       {Fp8GemmView{name, Fp8Gemm::kFprop, M, N, K, {a.high.data(), a.q.data(), a.shape, false},
                    {bt.high.data(), bt.q.data(), bt.shape, true}},
        Fp8GemmView{name, Fp8Gemm::kDgrad, M, N, K, {a.high.data(), a.q.data(), a.shape, false},
                    {b.high.data(), b.q.data(), b.shape, false}},
        Fp8GemmView{name, Fp8Gemm::kWgrad, M, N, K, {at.high.data(), at.q.data(), at.shape, true},
                    {b.high.data(), b.q.data(), b.shape, false}}}) {
    const Fp8GemmCheck c = check_fp8_gemm(v, 6, 8.0);
    EXPECT_EQ(c.elements, 6 * N) << fp8_gemm_name(v.gemm);
    EXPECT_GT(c.ratio, 0.0) << fp8_gemm_name(v.gemm);
    EXPECT_LT(c.ratio, 1.0) << fp8_gemm_name(v.gemm);
    EXPECT_LT(c.worst_ratio, 1.0) << fp8_gemm_name(v.gemm);
    EXPECT_GT(c.rel_error, 0.0) << fp8_gemm_name(v.gemm);
    EXPECT_NEAR(c.rel_error, brute_rel_error(v, 6), 1e-3 * c.rel_error) << fp8_gemm_name(v.gemm);
  }
}

TEST(Fp8GemmCheck, LostRowsAndSaturationPassTheBound) {
  const int64_t M = 16, N = 32, K = 64;
  Quantized a = quantize(normal(M * K, 6), M, K, Fp8Format::kE4M3);
  const Quantized b = quantize(normal(K * N, 7), K, N, Fp8Format::kE4M3);
  const std::string name = "layer/1/attn/qkv";
  const Fp8GemmView clean{name, Fp8Gemm::kDgrad, M, N, K, {a.high.data(), a.q.data(), a.shape, false},
                          {b.high.data(), b.q.data(), b.shape, false}};
  EXPECT_LT(check_fp8_gemm(clean, M, 8.0).ratio, 1.0);
  // Every row's first half quantized to zero, as a wrong scale's underflow would leave it.
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < K / 2; ++k) a.q[static_cast<size_t>(i * K + k)] = 0.0f;
  }
  EXPECT_GT(check_fp8_gemm(clean, M, 8.0).ratio, 1.0);
  const Quantized saturated = quantize(normal(M * K, 6), M, K, Fp8Format::kE4M3, 16.0f);
  const Fp8GemmView clipped{name, Fp8Gemm::kDgrad, M, N, K,
                            {saturated.high.data(), saturated.q.data(), saturated.shape, false},
                            {b.high.data(), b.q.data(), b.shape, false}};
  EXPECT_GT(check_fp8_gemm(clipped, M, 8.0).ratio, 1.0);
}

}  // namespace
}  // namespace lockstep::detect
