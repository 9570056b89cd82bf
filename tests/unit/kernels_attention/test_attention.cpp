// Attention and RoPE kernels (kernels/cpu/attention.cpp, rope.cpp) against the Bounded<double>
// reference (both modes, forward and backward), against a scalar transcription of the canonical
// contract (bitwise, for 1/2/3 threads), and the reference's own backward against MPFR finite
// differences.
#include <gtest/gtest.h>
#include <mpfr.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "kernels/ops/attention.hpp"
#include "kernels/ops/rope.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/transcendental.hpp"
#include "reference/attention.hpp"
#include "src/core/check.hpp"
#include "tests/support/bounded_compare.hpp"
#include "tests/support/mpfr_fd.hpp"
#include "tests/support/random_values.hpp"

namespace lockstep {
namespace {

using test::Bd;

// The shapes every test runs: T = 1, primes, MHA (NH = NKV), GQA (4/2), MQA (4/1), HS odd and
// even, T·group above 64 so that chunks of the t' and (j, t) reductions are crossed, and T = 137
// so that the softmax's eight-row groups close chunks at t' = 64 and 128 (and leave a row over).
const std::vector<AttentionShape> kShapes = {
    {1, 1, 1, 1, 3}, {2, 7, 4, 2, 4}, {1, 13, 4, 1, 5}, {2, 5, 3, 3, 8}, {1, 67, 2, 1, 6},
    {1, 23, 4, 1, 2}, {1, 137, 2, 1, 5}};

int64_t qkv_size(AttentionShape s) { return s.B * s.T * (s.NH + 2 * s.NKV) * s.HS; }
int64_t out_size(AttentionShape s) { return s.B * s.T * s.NH * s.HS; }
int64_t att_size(AttentionShape s) { return s.B * s.NH * s.T * s.T; }

std::string name_of(AttentionShape s) {
  return str_cat("B=", s.B, " T=", s.T, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS);
}

struct KernelRun {
  std::vector<float> out, att, dqkv;
};

KernelRun run_kernel(Mode mode, AttentionShape s, const std::vector<float>& qkv,
                     const std::vector<float>& dout) {
  KernelRun r{std::vector<float>(out_size(s)), std::vector<float>(att_size(s)),
              std::vector<float>(qkv_size(s), NAN)};
  std::vector<float> scratch(att_size(s));
  cpu::attention_forward(mode, s, r.out.data(), r.att.data(), qkv.data());
  cpu::attention_backward(mode, s, r.dqkv.data(), scratch.data(), dout.data(), qkv.data(),
                          r.att.data());
  return r;
}

TEST(Attention, BothModesWithinBoundedReference) {
  for (const auto s : kShapes) {
    const auto qkv = test::random_floats(qkv_size(s), 1);
    const auto dout = test::random_floats(out_size(s), 2);
    auto rq = test::to_bounded(qkv), rdout = test::to_bounded(dout);
    std::vector<Bd> rout(out_size(s)), ratt(att_size(s)), rdqkv(qkv_size(s)),
        rscratch(att_size(s));
    reference::attention_forward(s.B, s.T, s.NH, s.NKV, s.HS, rout.data(), ratt.data(), rq.data());
    reference::attention_backward(s.B, s.T, s.NH, s.NKV, s.HS, rdqkv.data(), rscratch.data(),
                                  rdout.data(), rq.data(), ratt.data());
    for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
      std::cout << name_of(s) << " " << mode_name(mode) << "\n";
      const auto k = run_kernel(mode, s, qkv, dout);
      test::expect_within("out", k.out, rout);
      test::expect_within("att", k.att, ratt);
      test::expect_within("dqkv", k.dqkv, rdqkv);
    }
  }
}

// The canonical contract of kernels/ops/attention.hpp, transcribed element by element with
// canonical.hpp's functions: what the kernel must equal bit for bit.
KernelRun contract(AttentionShape s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS, G = s.NH / s.NKV, T = s.T, HS = s.HS;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  KernelRun r{std::vector<float>(out_size(s)), std::vector<float>(att_size(s), 0.0f),
              std::vector<float>(qkv_size(s))};
  std::vector<float> ds(att_size(s), 0.0f), e(T);
  auto q = [&](int64_t b, int64_t t, int64_t h) { return qkv.data() + (b * T + t) * row + h * HS; };
  auto k = [&](int64_t b, int64_t t, int64_t g) { return q(b, t, s.NH + g); };
  auto v = [&](int64_t b, int64_t t, int64_t g) { return q(b, t, s.NH + s.NKV + g); };
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const int64_t g = h / G;
      for (int64_t t = 0; t < T; ++t) {
        float* a = r.att.data() + ((b * s.NH + h) * T + t) * T;
        float m = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          a[u] = canonical_dot(q(b, t, h), 1, k(b, u, g), 1, HS) * scale;
          m = std::max(m, a[u]);
        }
        for (int64_t u = 0; u <= t; ++u) e[u] = ls_expf(a[u] - m);
        const float Z = canonical_sum(e.data(), 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) a[u] = e[u] / Z;
        for (int64_t d = 0; d < HS; ++d) {
          r.out[(b * T + t) * s.NH * HS + h * HS + d] = canonical_dot(a, 1, v(b, 0, g) + d, row, t + 1);
        }
        const float* dy = dout.data() + (b * T + t) * s.NH * HS + h * HS;
        float* dsr = ds.data() + ((b * s.NH + h) * T + t) * T;
        for (int64_t u = 0; u <= t; ++u) dsr[u] = canonical_dot(dy, 1, v(b, u, g), 1, HS);
        const float D = canonical_dot(a, 1, dsr, 1, t + 1);
        for (int64_t u = 0; u <= t; ++u) dsr[u] = a[u] * (dsr[u] - D);
        for (int64_t d = 0; d < HS; ++d) {
          r.dqkv[(b * T + t) * row + h * HS + d] = canonical_dot(dsr, 1, k(b, 0, g) + d, row, t + 1) * scale;
        }
      }
    }
    // dk, dv: pairs (j, t), t >= t', in the order i = j·T + t, chunk = ⌊i/64⌋.
    for (int64_t g = 0; g < s.NKV; ++g) {
      for (int64_t u = 0; u < T; ++u) {
        for (int64_t d = 0; d < HS; ++d) {
          ChunkCombiner ck, cv;
          for (int64_t c0 = 0; c0 < G * T; c0 += kCanonicalChunk) {
            float acc_k = 0.0f, acc_v = 0.0f;
            for (int64_t i = c0; i < std::min(c0 + kCanonicalChunk, G * T); ++i) {
              const int64_t j = i / T, t = i % T, h = g * G + j;
              if (t < u) continue;
              const int64_t at = ((b * s.NH + h) * T + t) * T + u;
              acc_k = std::fma(ds[at], q(b, t, h)[d], acc_k);
              acc_v = std::fma(r.att[at], dout[(b * T + t) * s.NH * HS + h * HS + d], acc_v);
            }
            ck.add(acc_k);
            cv.add(acc_v);
          }
          r.dqkv[(b * T + u) * row + (s.NH + g) * HS + d] = ck.finish() * scale;
          r.dqkv[(b * T + u) * row + (s.NH + s.NKV + g) * HS + d] = cv.finish();
        }
      }
    }
  }
  return r;
}

TEST(Attention, CanonicalMatchesContractForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  for (const auto s : kShapes) {
    const auto qkv = test::random_floats(qkv_size(s), 3, -3.0f, 3.0f);
    const auto dout = test::random_floats(out_size(s), 4);
    const auto want = contract(s, qkv, dout);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const auto got = run_kernel(Mode::kCanonical, s, qkv, dout);
      SCOPED_TRACE(name_of(s) + str_cat(" threads=", threads));
      test::expect_bitwise("out", got.out, want.out);
      test::expect_bitwise("att", got.att, want.att);
      test::expect_bitwise("dqkv", got.dqkv, want.dqkv);
    }
  }
  omp_set_num_threads(saved);
}

TEST(Attention, RejectsHeadsNotDivisibleByKvHeads) {
  std::vector<float> buf(1000);
  EXPECT_THROW(cpu::attention_forward(Mode::kCanonical, {1, 2, 3, 2, 4}, buf.data(), buf.data(),
                                      buf.data()),
               ConfigError);
}

TEST(Rope, BothDirectionsWithinBoundedReference) {
  for (const auto s : {AttentionShape{2, 9, 4, 2, 6}, AttentionShape{1, 1, 2, 2, 2},
                       AttentionShape{1, 31, 4, 1, 8}}) {
    const int64_t half = s.HS / 2;
    std::vector<float> cs(s.T * half), sn(s.T * half);
    cpu::rope_tables(s.T, s.HS, 10000.0, cs.data(), sn.data());
    const auto x = test::random_floats(qkv_size(s), 5);
    auto got = x;
    cpu::rope_forward(s, got.data(), cs.data(), sn.data());
    auto want = test::to_bounded(x);
    const auto rc = test::to_bounded(cs), rs = test::to_bounded(sn);
    reference::rope_forward(s.B, s.T, s.NH, s.NKV, s.HS, want.data(), rc.data(), rs.data());
    std::cout << name_of(s) << "\n";
    test::expect_within("rope forward", got, want);
    auto back = x;
    cpu::rope_backward(s, back.data(), cs.data(), sn.data());
    auto want_back = test::to_bounded(x);
    reference::rope_backward(s.B, s.T, s.NH, s.NKV, s.HS, want_back.data(), rc.data(), rs.data());
    test::expect_within("rope backward", back, want_back);
    // v is untouched by both directions.
    for (int64_t r = 0; r < s.B * s.T; ++r) {
      for (int64_t i = (s.NH + s.NKV) * s.HS; i < (s.NH + 2 * s.NKV) * s.HS; ++i) {
        const int64_t at = r * (s.NH + 2 * s.NKV) * s.HS + i;
        ASSERT_EQ(got[at], x[at]);
        ASSERT_EQ(back[at], x[at]);
      }
    }
  }
}

// The tables against MPFR: cos/sin(t·theta^(-2i/HS)) evaluated at 128 bits. Bound: one fp32
// rounding (u·|value|, bounded_format().u) plus the double evaluation's error, which rope.cpp
// documents as at most T·2^-49 absolute (angle error t·2^-50 plus a few double ulps).
TEST(Rope, TablesWithinOneRoundingOfMpfr) {
  const int64_t T = 4096, HS = 64, half = HS / 2;
  for (double theta : {10000.0, 500000.0}) {
    std::vector<float> cs(T * half), sn(T * half);
    cpu::rope_tables(T, HS, theta, cs.data(), sn.data());
    const double u = reference::bounded_format().u;
    const double angle_term = static_cast<double>(T) * 0x1p-49;
    mpfr_t a, c, s, th;
    mpfr_inits2(128, a, c, s, th, static_cast<mpfr_ptr>(nullptr));
    double worst = 0;
    int64_t exact = 0;
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t t = 0; t < T; t += 7) {
        // angle = t · theta^(−2i/HS)
        mpfr_set_d(th, theta, MPFR_RNDN);
        mpfr_set_si(a, -2 * i, MPFR_RNDN);
        mpfr_div_si(a, a, HS, MPFR_RNDN);
        mpfr_pow(a, th, a, MPFR_RNDN);
        mpfr_mul_si(a, a, t, MPFR_RNDN);
        mpfr_sin_cos(s, c, a, MPFR_RNDN);
        for (auto [got, want] : {std::pair{cs[t * half + i], mpfr_get_d(c, MPFR_RNDN)},
                                 std::pair{sn[t * half + i], mpfr_get_d(s, MPFR_RNDN)}}) {
          const double bound = u * std::fabs(want) + angle_term;
          const double err = std::fabs(got - want);
          worst = std::max(worst, err / bound);
          exact += got == static_cast<float>(want);
          ASSERT_LE(err, bound) << "theta " << theta << " t " << t << " i " << i;
        }
      }
    }
    mpfr_clears(a, c, s, th, static_cast<mpfr_ptr>(nullptr));
    std::cout << "rope tables theta=" << theta << ": max tightness " << worst << ", "
              << exact << " entries equal to the correctly rounded value\n";
  }
}

TEST(Rope, RejectsOddHeadSize) {
  std::vector<float> t(10);
  EXPECT_THROW(cpu::rope_tables(2, 3, 10000.0, t.data(), t.data()), ConfigError);
}

// The reference's backward (RoPE then attention) against central differences of its forward in
// 100-digit MPFR along a random direction r, loss L = Σ out·w; the Richardson tolerance is
// derived in tests/support/mpfr_fd.hpp.
TEST(Attention, ReferenceBackwardMatchesMpfrFiniteDifferences) {
  using Real = test::Mpfr100;
  for (const auto s : {AttentionShape{1, 5, 4, 2, 4}, AttentionShape{2, 3, 2, 2, 2},
                       AttentionShape{1, 4, 4, 1, 6}}) {
    const int64_t half = s.HS / 2;
    std::vector<float> cs(s.T * half), sn(s.T * half);
    cpu::rope_tables(s.T, s.HS, 10000.0, cs.data(), sn.data());
    const std::vector<Real> rc(cs.begin(), cs.end()), rs(sn.begin(), sn.end());
    const auto xf = test::random_floats(qkv_size(s), 6);
    const auto rf = test::random_floats(qkv_size(s), 7);
    const auto wf = test::random_floats(out_size(s), 8);
    const std::vector<Real> x(xf.begin(), xf.end()), dir(rf.begin(), rf.end()),
        w(wf.begin(), wf.end());
    auto loss = [&]<class R>(const R& h) {
      const std::vector<R> c(rc.begin(), rc.end()), sn2(rs.begin(), rs.end());
      std::vector<R> p(x.size()), out(out_size(s)), att(att_size(s));
      for (size_t i = 0; i < x.size(); ++i) p[i] = R(x[i]) + h * R(dir[i]);
      reference::rope_forward(s.B, s.T, s.NH, s.NKV, s.HS, p.data(), c.data(), sn2.data());
      reference::attention_forward(s.B, s.T, s.NH, s.NKV, s.HS, out.data(), att.data(), p.data());
      R l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += out[i] * R(w[i]);
      return l;
    };
    // Analytic: forward at x, then backward with dout = w.
    auto analytic = [&]<class R>() {
      const std::vector<R> c(rc.begin(), rc.end()), sn2(rs.begin(), rs.end()), dout(w.begin(), w.end());
      std::vector<R> p(x.begin(), x.end()), out(out_size(s)), att(att_size(s)), scratch(att_size(s)),
          g(x.size());
      reference::rope_forward(s.B, s.T, s.NH, s.NKV, s.HS, p.data(), c.data(), sn2.data());
      reference::attention_forward(s.B, s.T, s.NH, s.NKV, s.HS, out.data(), att.data(), p.data());
      reference::attention_backward(s.B, s.T, s.NH, s.NKV, s.HS, g.data(), scratch.data(),
                                    dout.data(), p.data(), att.data());
      reference::rope_backward(s.B, s.T, s.NH, s.NKV, s.HS, g.data(), c.data(), sn2.data());
      R d = 0;
      for (size_t i = 0; i < g.size(); ++i) d += g[i] * R(dir[i]);
      return d;
    };
    test::expect_matches_central_difference<Real>(name_of(s), loss, analytic);
  }
}

}  // namespace
}  // namespace lockstep
