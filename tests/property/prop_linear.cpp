// Properties of the linear layer (forward, backward with parameter gradients) and of
// matmul_canonical, in both modes, over random shapes (1, primes, odd sizes, K up to 2000 or 5000) and
// values (±0, subnormals, large magnitudes, NaN/Inf).
//
// Reference: Bounded<Mpfr64> (reference/linear.hpp, rigorous: MPFR values, order-free γ bounds).
// Canonical mode is also bitwise equal to spec.hpp (canonical_dot transcribed), on every ISA.
// Large values: inp up to 2^100 with weights/dout below 2^4, so that Σ|terms| < FLT_MAX for
// K <= 2^13 and the running error analysis (which assumes no overflow) still holds.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/ops/linear.hpp"
#include "reference/linear.hpp"
#include "src/core/exact_sum.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {



const ValueKinds kActivations{3, true, true, 100};
const ValueKinds kWeights{3, true, true, 0};

RC_GTEST_PROP(LinearProperty, ForwardWithinMpfrBoundAndCanonicalBitwise, ()) {
  const LinearShape s{gen_dim(13), gen_dim(97), gen_dim(11)};
  const std::string where = shape_str({{"N", s.N}, {"IC", s.IC}, {"OC", s.OC}});
  const auto inp = gen_values(s.N * s.IC, kActivations);
  const auto weight = gen_values(s.OC * s.IC, kWeights);
  const bool has_bias = *rc::gen::arbitrary<bool>();
  const auto bias = gen_values(s.OC, kWeights);
  const float* b = has_bias ? bias.data() : nullptr;

  std::vector<BM> ref(s.N * s.OC);
  const auto binp = bounded<Mpfr64>(inp), bw = bounded<Mpfr64>(weight), bb = bounded<Mpfr64>(bias);
  reference::linear_forward(s.N, s.IC, s.OC, ref.data(), binp.data(), bw.data(),
                            has_bias ? bb.data() : nullptr);
  std::vector<float> spec(s.N * s.OC);
  spec::linear_forward(s.N, s.IC, s.OC, spec.data(), inp.data(), weight.data(), b);

  std::vector<float> out(s.N * s.OC);
  cpu::linear_forward(Mode::kFast, s, out.data(), inp.data(), weight.data(), b);
  check_within("linear_forward out fast", where, out, ref);
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::ScopedIsa scoped(isa);
    std::fill(out.begin(), out.end(), -1.0f);
    cpu::linear_forward(Mode::kCanonical, s, out.data(), inp.data(), weight.data(), b);
    check_within("linear_forward out canonical", where, out, ref);
    check_bitwise("linear_forward out canonical", where + " isa=" + std::string(cpu::isa_name(isa)),
                  out, spec);
  }
}

RC_GTEST_PROP(LinearProperty, BackwardWithinMpfrBoundAndCanonicalBitwise, ()) {
  // N up to 150 so that token reductions span several chunks of 64.
  const LinearShape s{gen_dim(150), gen_dim(23), gen_dim(19)};
  const std::string where = shape_str({{"N", s.N}, {"IC", s.IC}, {"OC", s.OC}});
  const auto inp = gen_values(s.N * s.IC, kWeights);
  const auto weight = gen_values(s.OC * s.IC, kWeights);
  const auto dout = gen_values(s.N * s.OC, kWeights);
  const auto dinp0 = gen_values(s.N * s.IC, kWeights);
  const auto dweight0 = gen_values(s.OC * s.IC, kWeights);
  const auto dbias0 = gen_values(s.OC, kWeights);
  const auto binp = bounded<Mpfr64>(inp), bw = bounded<Mpfr64>(weight), bdo = bounded<Mpfr64>(dout);

  // Fast: fp32 += into existing parameter gradients (reference adds with one rounding each);
  // dinp0 is overwritten on both sides.
  auto rdinp = bounded<Mpfr64>(dinp0), rdw = bounded<Mpfr64>(dweight0), rdb = bounded<Mpfr64>(dbias0);
  reference::linear_backward(s.N, s.IC, s.OC, rdinp.data(), rdw.data(), rdb.data(), bdo.data(),
                             binp.data(), bw.data());
  std::vector<float> dinp = dinp0, dweight = dweight0, dbias = dbias0;
  cpu::linear_backward(Mode::kFast, s, 0, dinp.data(), GradSink{dweight.data()},
                       GradSink{dbias.data()}, dout.data(), inp.data(), weight.data());
  check_within("linear_backward dinp fast", where, dinp, rdinp);
  check_within("linear_backward dweight fast", where, dweight, rdw);
  check_within("linear_backward dbias fast", where, dbias, rdb);

  // Canonical: parameter gradients into a zeroed exact accumulator, rounded once.
  std::vector<BM> edw(s.OC * s.IC, BM(0)), edb(s.OC, BM(0));
  reference::linear_backward<BM>(s.N, s.IC, s.OC, nullptr, edw.data(), edb.data(), bdo.data(),
                                 binp.data(), bw.data());
  std::vector<float> sdinp = dinp0, sdw(s.OC * s.IC), sdb(s.OC);
  spec::linear_backward(s.N, s.IC, s.OC, sdinp.data(), sdw.data(), sdb.data(), dout.data(),
                        inp.data(), weight.data());
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::ScopedIsa scoped(isa);
    const std::string w = where + " isa=" + std::string(cpu::isa_name(isa));
    dinp = dinp0;
    ExactAccumulator acc(static_cast<size_t>(s.OC * s.IC + s.OC));
    cpu::linear_backward(Mode::kCanonical, s, 0, dinp.data(), GradSink{nullptr, &acc, 0},
                         GradSink{nullptr, &acc, s.OC * s.IC}, dout.data(), inp.data(),
                         weight.data());
    std::vector<float> grads(acc.size());
    acc.round_to(grads.data());
    const std::vector<float> gw(grads.begin(), grads.begin() + s.OC * s.IC),
        gb(grads.begin() + s.OC * s.IC, grads.end());
    check_within("linear_backward dinp canonical", w, dinp, rdinp);
    check_within("linear_backward dweight canonical", w, gw, edw);
    check_within("linear_backward dbias canonical", w, gb, edb);
    check_bitwise("linear_backward dinp canonical", w, dinp, sdinp);
    check_bitwise("linear_backward dweight canonical", w, gw, sdw);
    check_bitwise("linear_backward dbias canonical", w, gb, sdb);
  }
}

// NaN/Inf in any operand reaches exactly the outputs whose formula reads it (both modes).
RC_GTEST_PROP(LinearProperty, NonFinitePropagatesLikeTheReference, ()) {
  const LinearShape s{gen_dim(7), gen_dim(70), gen_dim(7)};
  const std::string where = shape_str({{"N", s.N}, {"IC", s.IC}, {"OC", s.OC}});
  const bool poison_inp = *rc::gen::arbitrary<bool>();
  auto inp = gen_values(s.N * s.IC, kWeights);
  auto weight = gen_values(s.OC * s.IC, kWeights);
  if (poison_inp) {
    inp = with_nonfinite(inp);
  } else {
    weight = with_nonfinite(weight);
  }
  const auto dout = gen_values(s.N * s.OC, kWeights);
  std::vector<double> ref(s.N * s.OC), rdinp(s.N * s.IC, 0.0), rdw(s.OC * s.IC, 0.0),
      rdb(s.OC, 0.0);
  const auto di = doubles(inp), dw = doubles(weight), dd = doubles(dout);
  reference::linear_forward<double>(s.N, s.IC, s.OC, ref.data(), di.data(), dw.data(), nullptr);
  reference::linear_backward<double>(s.N, s.IC, s.OC, rdinp.data(), rdw.data(), rdb.data(),
                                     dd.data(), di.data(), dw.data());
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string w = where + " " + std::string(mode_name(mode));
    std::vector<float> out(s.N * s.OC), dinp(s.N * s.IC, 0.0f), dwf(s.OC * s.IC, 0.0f),
        dbf(s.OC, 0.0f);
    cpu::linear_forward(mode, s, out.data(), inp.data(), weight.data(), nullptr);
    check_nonfinite_pattern("linear_forward out", w, out, ref);
    ExactAccumulator acc(static_cast<size_t>(s.OC * s.IC + s.OC));
    const bool fast = mode == Mode::kFast;
    cpu::linear_backward(mode, s, 0, dinp.data(), fast ? GradSink{dwf.data()} : GradSink{nullptr, &acc, 0},
                         fast ? GradSink{dbf.data()} : GradSink{nullptr, &acc, s.OC * s.IC},
                         dout.data(), inp.data(), weight.data());
    if (!fast) {
      std::vector<float> grads(acc.size());
      acc.round_to(grads.data());
      std::copy(grads.begin(), grads.begin() + s.OC * s.IC, dwf.begin());
      std::copy(grads.begin() + s.OC * s.IC, grads.end(), dbf.begin());
    }
    check_nonfinite_pattern("linear_backward dinp", w, dinp, rdinp);
    check_nonfinite_pattern("linear_backward dweight", w, dwf, rdw);
    check_nonfinite_pattern("linear_backward dbias", w, dbf, rdb);
  }
}

// A product for the matmul properties: M and N up to 9, the given K, A and B each row- or
// column-major (values kActivations and kWeights), C's rows padded by 3.
struct StridedProduct {
  int64_t M, N, K, sam, sak, sbk, sbn, ldc;
  std::vector<float> A, B;
  std::string where;
};
StridedProduct gen_strided_product(int64_t K) {
  StridedProduct p;
  p.M = gen_dim(9), p.N = gen_dim(9), p.K = K;
  const bool a_rowmajor = *rc::gen::arbitrary<bool>(), b_rowmajor = *rc::gen::arbitrary<bool>();
  p.where = shape_str(
      {{"M", p.M}, {"N", p.N}, {"K", K}, {"A_rowmajor", a_rowmajor}, {"B_rowmajor", b_rowmajor}});
  p.A = gen_values(p.M * K, kActivations);
  p.B = gen_values(K * p.N, kWeights);
  p.sam = a_rowmajor ? K : 1, p.sak = a_rowmajor ? 1 : p.M;
  p.sbk = b_rowmajor ? p.N : 1, p.sbn = b_rowmajor ? 1 : K;
  p.ldc = p.N + 3;  // padded rows: the padding must stay untouched
  return p;
}

// matmul_canonical with general strides (A row- or column-major, B either), K up to 2000 or 5000
// (K blocks whose sums carry from block to block):
// bitwise equal to canonical_dot per element on every ISA, and within the Bounded<Mpfr64> dot
// bound. Large values: A up to 2^100, B below 2^4 (Σ|a·b| < 2^117 < FLT_MAX).
RC_GTEST_PROP(MatmulProperty, CanonicalBitwiseToSpecAndWithinMpfrBound, ()) {
  const auto [M, N, K, sam, sak, sbk, sbn, ldc, A, B, where] =
      gen_strided_product(*rc::gen::weightedOneOf<int64_t>(
          {{2, rc::gen::inRange<int64_t>(1, 200)}, {1, rc::gen::inRange<int64_t>(200, 2001)},
           {1, rc::gen::element<int64_t>(63, 64, 65, 127, 128, 129, 1999, 5000)}}));

  std::vector<float> spec(M * ldc, 7.0f);
  std::vector<BM> ref(M * ldc, BM(7.0));
  const auto bA = bounded<Mpfr64>(A), bB = bounded<Mpfr64>(B);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      spec[m * ldc + n] = canonical_dot(A.data() + m * sam, sak, B.data() + n * sbn, sbk, K);
      ref[m * ldc + n] = reference::dot(bA.data() + m * sam, sak, bB.data() + n * sbn, sbk, K);
    }
  }
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::ScopedIsa scoped(isa);
    const std::string w = where + " isa=" + std::string(cpu::isa_name(isa));
    std::vector<float> C(M * ldc, 7.0f);
    cpu::matmul_canonical(M, N, K, C.data(), ldc, A.data(), sam, sak, B.data(), sbk, sbn);
    check_bitwise("matmul_canonical C", w, C, spec);
    check_within("matmul_canonical C", w, C, ref);
  }
}

// matmul_fast (fast mode's GEMM where OpenBLAS's kernel is narrower than the CPU) with general
// strides, K up to 2048 or 5000 (several K blocks), alpha ±1, beta 0 over a C of NaNs (not read) or 1
// (C's values one more term of the sum), and with beta 0 maybe a column bias (one more term):
// within the order-free Bounded<Mpfr64> bound of Σ alpha·a·b (+ C or bias), on every ISA; the row
// padding of C stays untouched. The bias epilogue gives the very bits of the bias copied into C and
// added with beta = 1 (its contract: one addition to the first K block's result). (alpha scales
// the sums after their roundings: a |alpha| > 1 would scale their underflow errors too, beyond the
// bound of the scaled terms, so only exact sign changes are drawn.)
RC_GTEST_PROP(MatmulProperty, FastWithinMpfrBound, ()) {
  const auto [M, N, K, sam, sak, sbk, sbn, ldc, A, B, shape] =
      gen_strided_product(*rc::gen::weightedOneOf<int64_t>(
          {{2, rc::gen::inRange<int64_t>(0, 200)}, {1, rc::gen::inRange<int64_t>(200, 2049)},
           {1, rc::gen::element<int64_t>(63, 64, 65, 1024, 1025, 1999, 2048, 4097, 5000)}}));
  const float alpha = *rc::gen::element(1.0f, -1.0f);
  const float beta = *rc::gen::element(0.0f, 1.0f);
  const std::vector<float> bias = beta == 0.0f && *rc::gen::arbitrary<bool>() ? gen_values(N, kWeights) : std::vector<float>{};
  const std::string where = shape + " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
                            (bias.empty() ? "" : " bias");
  std::vector<float> C0(M * ldc, 7.0f);
  if (beta == 0.0f) {
    for (int64_t m = 0; m < M; ++m) std::fill_n(C0.begin() + m * ldc, N, std::nanf(""));
  } else {
    const auto c = gen_values(M * N, kWeights);
    for (int64_t m = 0; m < M; ++m) std::copy_n(c.begin() + m * N, N, C0.begin() + m * ldc);
  }

  std::vector<BM> ref(M * ldc, BM(7.0));
  const auto bA = bounded<Mpfr64>(A), bB = bounded<Mpfr64>(B);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      reference::OrderFree<Mpfr64> acc;
      if (beta != 0.0f) acc.add(BM(C0[m * ldc + n]));
      if (!bias.empty()) acc.add(BM(bias[n]));
      for (int64_t k = 0; k < K; ++k) {
        acc.add_product(BM(alpha) * bA[m * sam + k * sak], bB[n * sbn + k * sbk]);
      }
      ref[m * ldc + n] = acc.finish<BM>(true);
    }
  }
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::ScopedIsa scoped(isa);
    const std::string w = where + " isa=" + std::string(cpu::isa_name(isa));
    std::vector<float> C = C0;
    cpu::matmul_fast(M, N, K, alpha, A.data(), sam, sak, B.data(), sbk, sbn, beta, C.data(), ldc,
                     Operands::kFp32, {.col_bias = bias.empty() ? nullptr : bias.data()});
    check_within("matmul_fast C", w, C, ref);
    if (bias.empty()) continue;
    std::vector<float> onto = C0;
    for (int64_t m = 0; m < M; ++m) std::copy(bias.begin(), bias.end(), onto.begin() + m * ldc);
    cpu::matmul_fast(M, N, K, alpha, A.data(), sam, sak, B.data(), sbk, sbn, 1.0f, onto.data(), ldc);
    check_bitwise("matmul_fast C with its bias", w, C, onto);
  }
}

}  // namespace
}  // namespace lockstep::prop
