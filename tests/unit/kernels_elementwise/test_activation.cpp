// GELU (tanh form), SwiGLU and residual kernels: within the Bounded<double> reference's bounds in
// both modes (the bound charges tanh/exp the documented 4u); canonical mode bitwise equal to the
// scalar formulas with ls_tanhf / ls_expf and invariant under thread count; GELU bitwise equal to
// its scalar formulas on every ISA (8 and 16 lanes) over a stride through all fp32 bit patterns;
// NaN/inf propagate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/isa.hpp"
#include "kernels/ops/activation.hpp"
#include "kernels/ops/residual.hpp"
#include "kernels/ops/transcendental.hpp"
#include "reference/activation.hpp"
#include "support.hpp"

namespace lockstep::test {
namespace {

using reference::kGeluK0;
using reference::kGeluK1;
constexpr float kGeluK1x3 = 3.0f * kGeluK1;  // the kernel's fp32 constant

// The contract, scalar: the header's formulas, one rounding per operation, ls_tanhf / ls_expf.
float gelu_contract(float x) {
  return (0.5f * x) * (1.0f + ls_tanhf(kGeluK0 * (x + kGeluK1 * ((x * x) * x))));
}
float gelu_grad_contract(float x) {
  const float x2 = x * x;
  const float th = ls_tanhf(kGeluK0 * (x + kGeluK1 * (x2 * x)));
  const float sech2 = (1.0f - th) * (1.0f + th);
  const float term = sech2 == 0.0f ? 0.0f : ((0.5f * x) * sech2) * (kGeluK0 * (1.0f + kGeluK1x3 * x2));
  return 0.5f * (1.0f + th) + term;
}

// Inputs of GELU: a spread over [-8, 8] plus 0, ±tiny and values where x³ overflows.
std::vector<float> gelu_inputs(int64_t n, uint32_t seed) {
  std::vector<float> x = random_floats(n, seed, -8.0f, 8.0f);
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, 30.0f, -30.0f, 3e13f, -3e13f};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i * 3 % x.size()] = special[i];
  return x;
}

TEST(Gelu, WithinReferenceBoundsBothModes) {
  uint32_t seed = 5000;
  for (Mode mode : kModes) {
    for (int64_t n : {1, 7, 1000, 4099}) {
      const auto x = gelu_inputs(n, seed++);
      const auto dout = random_floats(n, seed++, -1.0f, 1.0f);
      std::vector<float> out(n), dinp(n);
      cpu::gelu_forward(mode, n, out.data(), x.data());
      cpu::gelu_backward(mode, n, dinp.data(), x.data(), dout.data());
      const auto bx = to_bounded(x), bdout = to_bounded(dout);
      std::vector<Bd> rout(n), rdinp(n);
      reference::gelu_forward<Bd>(n, rout.data(), bx.data());
      reference::gelu_backward<Bd>(n, rdinp.data(), bx.data(), bdout.data());
      const std::string what = "gelu " + std::string(mode_name(mode)) + " n=" + std::to_string(n);
      expect_within(what + " out", out, rout);
      expect_within(what + " dinp", dinp, rdinp);
    }
  }
}

TEST(SwiGlu, WithinReferenceBoundsBothModes) {
  uint32_t seed = 6000;
  // gate within ±80: e^{-g} stays finite in fp32 (the Bounded model has no overflow).
  for (Mode mode : kModes) {
    for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 65}, {5, 131}}) {
      auto inp = random_floats(N * 2 * F, seed++, -2.0f, 2.0f);
      const auto gates = random_floats(N * F, seed++, -80.0f, 80.0f);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t f = 0; f < F; f += 2) inp[n * 2 * F + f] = gates[n * F + f];  // wide and narrow
      }
      const auto dout = random_floats(N * F, seed++, -1.0f, 1.0f);
      std::vector<float> out(N * F), dinp(N * 2 * F);
      cpu::swiglu_forward(mode, N, F, out.data(), inp.data());
      cpu::swiglu_backward(mode, N, F, dinp.data(), inp.data(), dout.data());
      const auto bi = to_bounded(inp), bd = to_bounded(dout);
      std::vector<Bd> rout(N * F), rdinp(N * 2 * F);
      reference::swiglu_forward<Bd>(N, F, rout.data(), bi.data());
      reference::swiglu_backward<Bd>(N, F, rdinp.data(), bi.data(), bd.data());
      const std::string what = "swiglu " + std::string(mode_name(mode)) + " N=" +
                               std::to_string(N) + " F=" + std::to_string(F);
      expect_within(what + " out", out, rout);
      expect_within(what + " dinp", dinp, rdinp);
    }
  }
}

TEST(Residual, WithinReferenceBoundAndOneAddPerElement) {
  const int64_t n = 1001;
  const auto a = random_floats(n, 6500, -4.0f, 4.0f), b = random_floats(n, 6501, -4.0f, 4.0f);
  const auto out = expect_thread_invariant("residual", [&] {
    std::vector<float> o(n);
    cpu::residual_forward(n, o.data(), a.data(), b.data());
    return o;
  });
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  expect_bitwise("residual vs a + b", out, want);
  const auto ba = to_bounded(a), bb = to_bounded(b);
  std::vector<Bd> r(n);
  reference::residual_forward<Bd>(n, r.data(), ba.data(), bb.data());
  expect_within("residual", out, r);
}

// Every 4099th fp32 bit pattern (all binades, both signs, subnormals, ±0, ±inf, NaNs) and a length
// that leaves a scalar tail after the 8- and the 16-lane vectors.
std::vector<float> all_binades() {
  std::vector<float> x;
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) {
    const auto u = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  while (x.size() % 16 != 13) x.push_back(0.5f);
  return x;
}

// NaN matches any NaN (the vector and scalar code may return different payloads), all else bitwise.
void expect_same_or_both_nan(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t g, w;
    std::memcpy(&g, &got[i], sizeof g);
    std::memcpy(&w, &want[i], sizeof w);
    const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : g == w;
    if (!same && ++bad <= 5) ADD_FAILURE() << what << " at " << i << ": " << got[i] << " != " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Gelu, BitwiseToContractOnEveryIsa) {
  const std::vector<float> x = all_binades();
  const auto n = static_cast<int64_t>(x.size());
  const std::vector<float> dout(x.size(), 0.75f);
  std::vector<float> want_out(x.size()), want_dinp(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want_out[i] = gelu_contract(x[i]);
    want_dinp[i] = gelu_grad_contract(x[i]) * dout[i];
  }
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (!cpu::isa_supported(isa)) continue;
    cpu::ScopedIsa scope(isa);
    const std::string on = " on " + std::string(cpu::isa_name(isa));
    std::vector<float> out(x.size()), dinp(x.size());
    cpu::gelu_forward(Mode::kFast, n, out.data(), x.data());
    cpu::gelu_backward(Mode::kFast, n, dinp.data(), x.data(), dout.data());
    expect_same_or_both_nan("gelu forward" + on, out, want_out);
    expect_same_or_both_nan("gelu backward" + on, dinp, want_dinp);
  }
}

TEST(Activations, CanonicalMatchesContractAndThreadCount) {
  const int64_t n = 3001;
  const auto x = gelu_inputs(n, 7000);
  const auto dout = random_floats(n, 7001, -1.0f, 1.0f);
  const auto got = expect_thread_invariant("gelu canonical", [&] {
    std::vector<float> out(n), dinp(n);
    cpu::gelu_forward(Mode::kCanonical, n, out.data(), x.data());
    cpu::gelu_backward(Mode::kCanonical, n, dinp.data(), x.data(), dout.data());
    return concat({&out, &dinp});
  });
  std::vector<float> want(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    want[i] = gelu_contract(x[i]);
    want[n + i] = gelu_grad_contract(x[i]) * dout[i];
  }
  expect_bitwise("gelu canonical vs contract", got, want);

  const int64_t N = 7, F = 97;
  const auto inp = random_floats(N * 2 * F, 7002, -12.0f, 12.0f);
  const auto dy = random_floats(N * F, 7003, -1.0f, 1.0f);
  const auto sw = expect_thread_invariant("swiglu canonical", [&] {
    std::vector<float> out(N * F), dinp(N * 2 * F);
    cpu::swiglu_forward(Mode::kCanonical, N, F, out.data(), inp.data());
    cpu::swiglu_backward(Mode::kCanonical, N, F, dinp.data(), inp.data(), dy.data());
    return concat({&out, &dinp});
  });
  std::vector<float> sw_want(N * F + N * 2 * F);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t f = 0; f < F; ++f) {
      const float g = inp[r * 2 * F + f], up = inp[r * 2 * F + F + f], d = dy[r * F + f];
      const float den = 1.0f + ls_expf(-g);
      const float sig = 1.0f / den;
      sw_want[r * F + f] = (g / den) * up;
      sw_want[N * F + r * 2 * F + f] = (d * up) * (sig * (1.0f + g * (1.0f - sig)));
      sw_want[N * F + r * 2 * F + F + f] = d * (g / den);
    }
  }
  expect_bitwise("swiglu canonical vs contract", sw, sw_want);
}

// NaN in -> NaN out, forward and backward; ±inf follow the formulas (documented in the header):
// gelu(+inf) = +inf, gelu(-inf) = NaN (−inf·0), gelu'(±inf) finite; the double reference agrees.
TEST(Activations, NonFiniteInputsPropagate) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {nan, inf, -inf, 1.0f};
  const std::vector<float> dout = {1.0f, 1.0f, 1.0f, nan};
  const std::vector<double> xd(x.begin(), x.end()), dd(dout.begin(), dout.end());
  std::vector<double> rout(4), rdinp(4);
  reference::gelu_forward<double>(4, rout.data(), xd.data());
  reference::gelu_backward<double>(4, rdinp.data(), xd.data(), dd.data());
  for (Mode mode : kModes) {
    std::vector<float> out(4), dinp(4);
    cpu::gelu_forward(mode, 4, out.data(), x.data());
    cpu::gelu_backward(mode, 4, dinp.data(), x.data(), dout.data());
    EXPECT_TRUE(std::isnan(out[0]) && std::isnan(dinp[0])) << mode_name(mode);
    EXPECT_EQ(out[1], inf) << mode_name(mode);
    EXPECT_TRUE(std::isnan(out[2])) << mode_name(mode);
    EXPECT_TRUE(std::isnan(dinp[3])) << mode_name(mode);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(std::isnan(out[i]), std::isnan(rout[i])) << mode_name(mode) << " gelu " << i;
    }
    EXPECT_TRUE(std::isnan(dinp[0]) && std::isnan(rdinp[0]));

    // SwiGLU: NaN in the gate or in up poisons that output and its gradients only.
    const std::vector<float> inp = {nan, 1.0f, 2.0f, nan};  // N=1, F=2: gates {nan,1}, ups {2,nan}
    const std::vector<float> dy = {1.0f, 1.0f};
    std::vector<float> sout(2), sd(4);
    cpu::swiglu_forward(mode, 1, 2, sout.data(), inp.data());
    cpu::swiglu_backward(mode, 1, 2, sd.data(), inp.data(), dy.data());
    EXPECT_TRUE(std::isnan(sout[0]) && std::isnan(sout[1])) << mode_name(mode);
    EXPECT_TRUE(std::isnan(sd[0]) && std::isnan(sd[2])) << mode_name(mode);  // gate 0, up 0
    EXPECT_TRUE(std::isnan(sd[1]) && std::isfinite(sd[3])) << mode_name(mode);  // gate 1, up 1
  }
}

}  // namespace
}  // namespace lockstep::test
