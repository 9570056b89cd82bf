// Tests of the CPU linear layer (kernels/cpu/linear.cpp) and of its reference
// (reference/linear.hpp):
//  - both modes within the order-free bounds of reference<Bounded<double>> (tightness printed),
//    fast mode at 1 and 3 threads (its products split rows or columns over the threads);
//  - canonical mode equal to the scalar canonical specification bit for bit, on every ISA;
//  - canonical dweight/dbias invariant under splitting the tokens at chunk boundaries;
//  - the reference backward against central finite differences of the reference forward in MPFR.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/ops/canonical.hpp"
#include "kernels/ops/linear.hpp"
#include "reference/linear.hpp"
#include "src/core/check.hpp"
#include "tests/support/bounded_compare.hpp"
#include "tests/support/mpfr_fd.hpp"
#include "tests/support/random_values.hpp"
#include "verify/core/compare.hpp"

namespace lockstep::cpu {
namespace {

using test::Bd;
using test::expect_within;
using test::to_bounded;

std::vector<float> random_vector(int64_t n, std::mt19937_64& g) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = test::random_value(g);
  return v;
}

struct Problem {
  LinearShape s;
  std::vector<float> inp, weight, bias, dout, dinp0, dweight0, dbias0;
  Problem(LinearShape shape, uint64_t seed) : s(shape) {
    std::mt19937_64 g(seed);
    inp = random_vector(s.N * s.IC, g);
    weight = random_vector(s.OC * s.IC, g);
    bias = random_vector(s.OC, g);
    dout = random_vector(s.N * s.OC, g);
    dinp0 = random_vector(s.N * s.IC, g);
    dweight0 = random_vector(s.OC * s.IC, g);
    dbias0 = random_vector(s.OC, g);
  }
};

// The canonical backward of the whole problem into one accumulator, rounded: dweight (OC x IC)
// then dbias (OC). dinp (N x IC, or null) is overwritten as usual.
std::vector<float> canonical_weight_grads(const Problem& p, float* dinp) {
  ExactAccumulator acc(p.s.OC * p.s.IC + p.s.OC);
  linear_backward(Mode::kCanonical, p.s, 0, dinp, GradSink{nullptr, &acc, 0},
                  GradSink{nullptr, &acc, p.s.OC * p.s.IC}, p.dout.data(), p.inp.data(), p.weight.data());
  std::vector<float> grads(acc.size());
  acc.round_to(grads.data());
  return grads;
}

// {N, IC, OC}. With more than one thread, fast mode's products split the longer side of the output
// in slices of 64: rows (130, 200), columns of a transposed B (40 x 300), of a plain B (1 x 1000).
const LinearShape kShapes[] = {{130, 70, 50}, {64, 33, 17}, {1, 1000, 3}, {200, 5, 129}, {40, 24, 300}};

// Thread counts fast mode is checked at; omp_set_num_threads is process-wide, so it is restored.
constexpr int kFastThreads[] = {1, 3};
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous_); }

 private:
  int previous_;
};

TEST(Linear, ForwardWithinReferenceBounds) {
  for (const LinearShape& s : kShapes) {
    const Problem p(s, 11);
    std::vector<Bd> ref(s.N * s.OC);
    const auto inp = to_bounded(p.inp), weight = to_bounded(p.weight), bias = to_bounded(p.bias);
    reference::linear_forward(s.N, s.IC, s.OC, ref.data(), inp.data(), weight.data(), bias.data());
    std::vector<float> out(s.N * s.OC);
    for (int threads : kFastThreads) {
      ScopedThreads scope(threads);
      linear_forward(Mode::kFast, s, out.data(), p.inp.data(), p.weight.data(), p.bias.data());
      expect_within("forward fast N=" + std::to_string(s.N) + " threads=" + std::to_string(threads), out, ref);
    }
    linear_forward(Mode::kCanonical, s, out.data(), p.inp.data(), p.weight.data(), p.bias.data());
    expect_within("forward canonical N=" + std::to_string(s.N), out, ref);
  }
}

TEST(Linear, BackwardWithinReferenceBounds) {
  for (const LinearShape& s : kShapes) {
    const Problem p(s, 12);
    const auto dout = to_bounded(p.dout), inp = to_bounded(p.inp), weight = to_bounded(p.weight);
    // Accumulating fp32 parameter gradients: reference += adds the rounding of the kernel's +=.
    // dinp0 is overwritten on both sides.
    auto dinp_ref = to_bounded(p.dinp0), dweight_ref = to_bounded(p.dweight0), dbias_ref = to_bounded(p.dbias0);
    reference::linear_backward(s.N, s.IC, s.OC, dinp_ref.data(), dweight_ref.data(),
                               dbias_ref.data(), dout.data(), inp.data(), weight.data());
    // The exact accumulator rounds once: its reference is a single reduction over all tokens.
    std::vector<Bd> dweight_exact_ref(s.OC * s.IC, Bd(0.0)), dbias_exact_ref(s.OC, Bd(0.0));
    for (int64_t o = 0; o < s.OC; ++o) {
      for (int64_t i = 0; i < s.IC; ++i)
        dweight_exact_ref[o * s.IC + i] = reference::dot(dout.data() + o, s.OC, inp.data() + i, s.IC, s.N);
      dbias_exact_ref[o] = reference::sum(dout.data() + o, s.OC, s.N);
    }
    const std::string tag = " N=" + std::to_string(s.N);

    std::vector<float> dinp, dweight, dbias;
    for (int threads : kFastThreads) {
      ScopedThreads scope(threads);
      dinp = p.dinp0, dweight = p.dweight0, dbias = p.dbias0;
      linear_backward(Mode::kFast, s, 0, dinp.data(), GradSink{dweight.data()}, GradSink{dbias.data()},
                      p.dout.data(), p.inp.data(), p.weight.data());
      const std::string at = tag + " threads=" + std::to_string(threads);
      expect_within("dinp fast" + at, dinp, dinp_ref);
      expect_within("dweight fast" + at, dweight, dweight_ref);
      expect_within("dbias fast" + at, dbias, dbias_ref);
    }

    dinp = p.dinp0;
    const std::vector<float> grads = canonical_weight_grads(p, dinp.data());
    expect_within("dinp canonical" + tag, dinp, dinp_ref);
    expect_within("dweight canonical" + tag,
                  std::vector<float>(grads.begin(), grads.begin() + s.OC * s.IC), dweight_exact_ref);
    expect_within("dbias canonical" + tag,
                  std::vector<float>(grads.begin() + s.OC * s.IC, grads.end()), dbias_exact_ref);
  }
}

// Canonical linear equals the scalar specification of kernels/ops/linear.hpp element by element.
TEST(Linear, CanonicalEqualsScalarSpecification) {
  for (const LinearShape& s : kShapes) {
    const Problem p(s, 13);
    std::vector<float> out_spec(s.N * s.OC), dinp_spec = p.dinp0, dweight_spec(s.OC * s.IC),
        dbias_spec(s.OC);
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t o = 0; o < s.OC; ++o)
        out_spec[n * s.OC + o] = canonical_dot(&p.inp[n * s.IC], 1, &p.weight[o * s.IC], 1, s.IC) + p.bias[o];
      for (int64_t i = 0; i < s.IC; ++i)
        dinp_spec[n * s.IC + i] = canonical_dot(&p.dout[n * s.OC], 1, &p.weight[i], s.IC, s.OC);
    }
    for (int64_t o = 0; o < s.OC; ++o) {
      for (int64_t i = 0; i < s.IC; ++i)
        dweight_spec[o * s.IC + i] = canonical_dot(&p.dout[o], s.OC, &p.inp[i], s.IC, s.N);
      dbias_spec[o] = canonical_sum(&p.dout[o], s.OC, s.N);
    }
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      ScopedIsa scope(isa);
      const std::string tag = std::string(isa_name(isa)) + " N=" + std::to_string(s.N);
      std::vector<float> out(s.N * s.OC), dinp = p.dinp0;
      linear_forward(Mode::kCanonical, s, out.data(), p.inp.data(), p.weight.data(), p.bias.data());
      const std::vector<float> grads = canonical_weight_grads(p, dinp.data());
      auto r = verify::compare_exact(out.data(), out_spec.data(), s.N * s.OC);
      ASSERT_TRUE(r.ok()) << r.summary("out " + tag);
      r = verify::compare_exact(dinp.data(), dinp_spec.data(), s.N * s.IC);
      ASSERT_TRUE(r.ok()) << r.summary("dinp " + tag);
      r = verify::compare_exact(grads.data(), dweight_spec.data(), s.OC * s.IC);
      ASSERT_TRUE(r.ok()) << r.summary("dweight " + tag);
      r = verify::compare_exact(grads.data() + s.OC * s.IC, dbias_spec.data(), s.OC);
      ASSERT_TRUE(r.ok()) << r.summary("dbias " + tag);
    }
  }
}

// Micro-batches / sequence shards: two calls split at a chunk boundary into the same accumulator
// give the bits of one call over all tokens, for any thread count.
TEST(Linear, CanonicalWeightGradInvariantUnderTokenSplit) {
  const LinearShape whole{300, 40, 24};
  const Problem p(whole, 14);
  const size_t n_grad = whole.OC * whole.IC + whole.OC;
  const std::vector<float> want = canonical_weight_grads(p, nullptr);
  const int previous_threads = omp_get_max_threads();
  for (int64_t split : {64, 128, 256}) {
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      ExactAccumulator two(n_grad);
      const LinearShape first{split, whole.IC, whole.OC}, second{whole.N - split, whole.IC, whole.OC};
      // Second half first: the order of the calls must not matter either.
      linear_backward(Mode::kCanonical, second, split, nullptr, GradSink{nullptr, &two, 0},
                      GradSink{nullptr, &two, whole.OC * whole.IC}, p.dout.data() + split * whole.OC,
                      p.inp.data() + split * whole.IC, p.weight.data());
      linear_backward(Mode::kCanonical, first, 0, nullptr, GradSink{nullptr, &two, 0},
                      GradSink{nullptr, &two, whole.OC * whole.IC}, p.dout.data(), p.inp.data(),
                      p.weight.data());
      std::vector<float> got(n_grad);
      two.round_to(got.data());
      const auto r = verify::compare_exact(got.data(), want.data(), static_cast<int64_t>(n_grad));
      EXPECT_TRUE(r.ok()) << r.summary("split at " + std::to_string(split) + ", threads " +
                                       std::to_string(threads));
    }
  }
  omp_set_num_threads(previous_threads);
}

TEST(Linear, RefusesSplitInsideChunkAndMismatchedSinks) {
  const LinearShape s{10, 4, 3};
  const Problem p(s, 15);
  ExactAccumulator acc(s.OC * s.IC);
  std::vector<float> dweight(s.OC * s.IC);
  try {
    linear_backward(Mode::kCanonical, s, 32, nullptr, GradSink{nullptr, &acc, 0}, GradSink{},
                    p.dout.data(), p.inp.data(), p.weight.data());
    ADD_FAILURE() << "token_offset 32 was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the canonical chunk"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(linear_backward(Mode::kCanonical, s, 0, nullptr, GradSink{dweight.data()},
                               GradSink{}, p.dout.data(), p.inp.data(), p.weight.data()),
               InternalError);
  EXPECT_THROW(linear_backward(Mode::kFast, s, 0, nullptr, GradSink{nullptr, &acc, 0}, GradSink{},
                               p.dout.data(), p.inp.data(), p.weight.data()),
               InternalError);
}

// The reference differentiates itself correctly: for the loss L = Σ out·w, the directional
// derivative Σ ∇L·d from reference::linear_backward (dout = w) must match the central difference
// D(h) = (L(x + h·d) − L(x − h·d)) / 2h computed in 100-bit MPFR.
TEST(LinearReference, BackwardMatchesMpfrFiniteDifferences) {
  using Mp = test::Mpfr100;
  const Mp u = ldexp(Mp(1), -100);  // unit roundoff of 100-bit MPFR
  const int64_t N = 7, IC = 9, OC = 5;
  std::mt19937_64 g(16);
  std::normal_distribution<double> normal;
  auto draw = [&](int64_t n) {
    std::vector<Mp> v(n);
    for (auto& x : v) x = Mp(normal(g));
    return v;
  };
  const auto inp = draw(N * IC), weight = draw(OC * IC), bias = draw(OC), w = draw(N * OC);
  const auto d_inp = draw(N * IC), d_weight = draw(OC * IC), d_bias = draw(OC);

  // Returns L at x + h·d and a rounding-error bound γ_n(u)·Σ|terms| for its evaluation (n counts
  // the terms of the longest sum: IC products and the bias per output, N·OC outputs).
  auto loss = [&](const Mp& h, Mp* err) {
    std::vector<Mp> x(N * IC), W(OC * IC), b(OC), out(N * OC), xa(N * IC), Wa(OC * IC), ba(OC),
        outa(N * OC);
    for (int64_t i = 0; i < N * IC; ++i) { x[i] = inp[i] + h * d_inp[i]; xa[i] = abs(x[i]); }
    for (int64_t i = 0; i < OC * IC; ++i) { W[i] = weight[i] + h * d_weight[i]; Wa[i] = abs(W[i]); }
    for (int64_t i = 0; i < OC; ++i) { b[i] = bias[i] + h * d_bias[i]; ba[i] = abs(b[i]); }
    reference::linear_forward(N, IC, OC, out.data(), x.data(), W.data(), b.data());
    reference::linear_forward(N, IC, OC, outa.data(), xa.data(), Wa.data(), ba.data());
    Mp L = 0, mag = 0;
    for (int64_t i = 0; i < N * OC; ++i) { L += out[i] * w[i]; mag += outa[i] * abs(w[i]); }
    const Mp n = Mp(IC + 1 + N * OC + 3);  // + the perturbation x + h·d (2 roundings) and the product
    *err = n * u / (1 - n * u) * mag;
    return L;
  };
  auto central = [&](const Mp& h, Mp* err) {
    Mp e1, e2;
    const Mp D = (loss(h, &e1) - loss(-h, &e2)) / (2 * h);
    *err = (e1 + e2) / (2 * h) + 2 * u * abs(D);
    return D;
  };

  // Analytic directional derivative and a bound on its own rounding (same backward on |values|).
  std::vector<Mp> dinp(N * IC, Mp(0)), dweight(OC * IC, Mp(0)), dbias(OC, Mp(0));
  reference::linear_backward(N, IC, OC, dinp.data(), dweight.data(), dbias.data(), w.data(),
                             inp.data(), weight.data());
  std::vector<Mp> ainp(N * IC), aweight(OC * IC), aw(N * OC);
  for (int64_t i = 0; i < N * IC; ++i) ainp[i] = abs(inp[i]);
  for (int64_t i = 0; i < OC * IC; ++i) aweight[i] = abs(weight[i]);
  for (int64_t i = 0; i < N * OC; ++i) aw[i] = abs(w[i]);
  std::vector<Mp> minp(N * IC, Mp(0)), mweight(OC * IC, Mp(0)), mbias(OC, Mp(0));
  reference::linear_backward(N, IC, OC, minp.data(), mweight.data(), mbias.data(), aw.data(),
                             ainp.data(), aweight.data());
  Mp analytic = 0, analytic_mag = 0;
  for (int64_t i = 0; i < N * IC; ++i) { analytic += dinp[i] * d_inp[i]; analytic_mag += minp[i] * abs(d_inp[i]); }
  for (int64_t i = 0; i < OC * IC; ++i) { analytic += dweight[i] * d_weight[i]; analytic_mag += mweight[i] * abs(d_weight[i]); }
  for (int64_t i = 0; i < OC; ++i) { analytic += dbias[i] * d_bias[i]; analytic_mag += mbias[i] * abs(d_bias[i]); }
  const Mp n_analytic = Mp(std::max(N, OC) + N * IC + OC * IC + OC);
  const Mp analytic_err = n_analytic * u / (1 - n_analytic * u) * analytic_mag;

  const Mp h = ldexp(Mp(1), -20);
  Mp err_h, err_2h;
  const Mp D_h = central(h, &err_h), D_2h = central(2 * h, &err_2h);
  // Richardson: D(h) = D + c·h² + O(h⁴) gives truncation(h) ≈ (D(2h) − D(h)) / 3. The tolerance
  // takes |D(2h) − D(h)| (the estimate with room for the O(h⁴) term) plus the rounding bounds of
  // both differences and of the analytic side. For this bilinear loss the truncation is zero
  // in exact arithmetic, so the difference is rounding noise; a wrong gradient is off by O(1).
  const Mp tol = abs(D_2h - D_h) + err_h + err_2h + analytic_err;
  const Mp diff = abs(analytic - D_h);
  std::cout << "gradient check: |analytic - FD| = " << diff.str(6) << ", tolerance "
            << tol.str(6) << ", |analytic| = " << Mp(abs(analytic)).str(6) << "\n";
  RecordProperty("fd tightness", Mp(diff / tol).str(6));
  EXPECT_LE(diff, tol);
  // The check resolves relative errors below the step h = 2^-20 (as tests/unit/kernels_elementwise/
  // test_gradcheck.cpp requires), so any wrong formula, off by O(1), fails it.
  EXPECT_LT(tol, h * abs(analytic)) << "the check would not notice a wrong gradient";
}

}  // namespace
}  // namespace lockstep::cpu
