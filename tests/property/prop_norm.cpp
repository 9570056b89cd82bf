// Properties of LayerNorm and RMSNorm, forward and backward (dinp, dweight, dbias), both modes.
//
// Rows are either independent random values or nearly constant (a large offset plus tiny
// perturbations: where a one-pass E[x²]−E[x]² variance cancels catastrophically). Values include
// ±0, subnormals and magnitudes up to 2^50 (Σx² < 2^110: no overflow, so the bounds hold).
// Reference: Bounded<double> (reference/norm.hpp; MPFR is not needed: the double values are
// 2^-29 of the fp32 bounds). Canonical mode is also bitwise equal to spec.hpp.
// Backward is checked as a function of its inputs: mean/rstd are the kernel's forward outputs,
// fed to kernel, reference and spec alike.
#include <string>
#include <vector>

#include "kernels/ops/norm.hpp"
#include "reference/norm.hpp"
#include "src/core/exact_sum.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {


const ValueKinds kValues{3, true, true, 50};
const ValueKinds kSmall{3, true, true, 0};

// (N, C) input rows, each either random or offset + 2^-12·(small random).
std::vector<float> gen_rows(int64_t N, int64_t C) {
  std::vector<float> x = gen_values(N * C, kValues);
  for (int64_t n = 0; n < N; ++n) {
    if (!*rc::gen::arbitrary<bool>()) continue;
    const float offset = *rc::gen::map(rc::gen::inRange<int32_t>(-4096, 4097),
                                       [](int32_t i) { return static_cast<float>(i) * 0.25f; });
    for (int64_t c = 0; c < C; ++c) {
      x[n * C + c] = offset + std::ldexp(static_cast<float>(*rc::gen::inRange<int32_t>(-64, 65)), -12);
    }
  }
  return x;
}

float gen_eps() { return *rc::gen::element(1e-5f, 1e-6f, 1e-3f); }

std::vector<float> rounded(ExactAccumulator& acc, size_t from, size_t n) {
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = acc.round(from + i);
  return r;
}

RC_GTEST_PROP(LayerNormProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  const NormShape s{gen_dim(140), gen_dim(150), gen_eps()};
  const std::string where = shape_str({{"N", s.N}, {"C", s.C}}) + " eps=" + std::to_string(s.eps);
  const auto x = gen_rows(s.N, s.C);
  const auto w = gen_values(s.C, kSmall), b = gen_values(s.C, kSmall);
  const auto dout = gen_values(s.N * s.C, kSmall), dinp0 = gen_values(s.N * s.C, kSmall);
  const auto dw0 = gen_values(s.C, kSmall), db0 = gen_values(s.C, kSmall);

  // Forward.
  std::vector<BD> rout(s.N * s.C), rmean(s.N), rrstd(s.N);
  const auto bx = bounded<double>(x), bw = bounded<double>(w), bb = bounded<double>(b);
  reference::layernorm_forward(s.N, s.C, s.eps, rout.data(), rmean.data(), rrstd.data(), bx.data(),
                               bw.data(), bb.data());
  std::vector<float> sout(s.N * s.C), smean(s.N), srstd(s.N);
  spec::layernorm_forward(s.N, s.C, s.eps, sout.data(), smean.data(), srstd.data(), x.data(),
                          w.data(), b.data());
  std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    cpu::layernorm_forward(mode, s, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data());
    check_within("layernorm_forward out " + m, where, out, rout);
    check_within("layernorm_forward mean " + m, where, mean, rmean);
    check_within("layernorm_forward rstd " + m, where, rstd, rrstd);
  }
  check_bitwise("layernorm_forward out canonical", where, out, sout);
  check_bitwise("layernorm_forward mean canonical", where, mean, smean);
  check_bitwise("layernorm_forward rstd canonical", where, rstd, srstd);

  // Backward, from the canonical forward's cached statistics.
  const auto bdo = bounded<double>(dout), bmean = bounded<double>(mean), brstd = bounded<double>(rstd);
  auto rdinp = bounded<double>(dinp0), rdw = bounded<double>(dw0), rdb = bounded<double>(db0);
  reference::layernorm_backward(s.N, s.C, rdinp.data(), rdw.data(), rdb.data(), bdo.data(), bx.data(),
                                bw.data(), bmean.data(), brstd.data());
  std::vector<BD> edw(s.C, BD(0.0)), edb(s.C, BD(0.0)), unused = bounded<double>(dinp0);
  reference::layernorm_backward(s.N, s.C, unused.data(), edw.data(), edb.data(), bdo.data(),
                                bx.data(), bw.data(), bmean.data(), brstd.data());
  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  cpu::layernorm_backward(Mode::kFast, s, 0, dinp.data(), GradSink{dw.data()}, GradSink{db.data()},
                          dout.data(), x.data(), w.data(), mean.data(), rstd.data());
  check_within("layernorm_backward dinp fast", where, dinp, rdinp);
  check_within("layernorm_backward dweight fast", where, dw, rdw);
  check_within("layernorm_backward dbias fast", where, db, rdb);

  dinp = dinp0;
  ExactAccumulator acc(static_cast<size_t>(2 * s.C));
  cpu::layernorm_backward(Mode::kCanonical, s, 0, dinp.data(), GradSink{nullptr, &acc, 0},
                          GradSink{nullptr, &acc, s.C}, dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data());
  const auto gw = rounded(acc, 0, s.C), gb = rounded(acc, s.C, s.C);
  check_within("layernorm_backward dinp canonical", where, dinp, rdinp);
  check_within("layernorm_backward dweight canonical", where, gw, edw);
  check_within("layernorm_backward dbias canonical", where, gb, edb);
  std::vector<float> sdinp = dinp0, sdw(s.C), sdb(s.C);
  spec::norm_backward(s.N, s.C, sdinp.data(), sdw.data(), sdb.data(), dout.data(), x.data(),
                      w.data(), mean.data(), rstd.data());
  check_bitwise("layernorm_backward dinp canonical", where, dinp, sdinp);
  check_bitwise("layernorm_backward dweight canonical", where, gw, sdw);
  check_bitwise("layernorm_backward dbias canonical", where, gb, sdb);
}

RC_GTEST_PROP(RmsNormProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  const NormShape s{gen_dim(140), gen_dim(150), gen_eps()};
  const std::string where = shape_str({{"N", s.N}, {"C", s.C}}) + " eps=" + std::to_string(s.eps);
  const auto x = gen_rows(s.N, s.C);
  const auto w = gen_values(s.C, kSmall);
  const auto dout = gen_values(s.N * s.C, kSmall), dinp0 = gen_values(s.N * s.C, kSmall);
  const auto dw0 = gen_values(s.C, kSmall);

  std::vector<BD> rout(s.N * s.C), rrstd(s.N);
  const auto bx = bounded<double>(x), bw = bounded<double>(w);
  reference::rmsnorm_forward(s.N, s.C, s.eps, rout.data(), rrstd.data(), bx.data(), bw.data());
  std::vector<float> sout(s.N * s.C), srstd(s.N);
  spec::rmsnorm_forward(s.N, s.C, s.eps, sout.data(), srstd.data(), x.data(), w.data());
  std::vector<float> out(s.N * s.C), rstd(s.N);
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    cpu::rmsnorm_forward(mode, s, out.data(), rstd.data(), x.data(), w.data());
    check_within("rmsnorm_forward out " + m, where, out, rout);
    check_within("rmsnorm_forward rstd " + m, where, rstd, rrstd);
  }
  check_bitwise("rmsnorm_forward out canonical", where, out, sout);
  check_bitwise("rmsnorm_forward rstd canonical", where, rstd, srstd);

  const auto bdo = bounded<double>(dout), brstd = bounded<double>(rstd);
  auto rdinp = bounded<double>(dinp0), rdw = bounded<double>(dw0);
  reference::rmsnorm_backward(s.N, s.C, rdinp.data(), rdw.data(), bdo.data(), bx.data(), bw.data(),
                              brstd.data());
  std::vector<BD> edw(s.C, BD(0.0)), unused = bounded<double>(dinp0);
  reference::rmsnorm_backward(s.N, s.C, unused.data(), edw.data(), bdo.data(), bx.data(), bw.data(),
                              brstd.data());
  std::vector<float> dinp = dinp0, dw = dw0;
  cpu::rmsnorm_backward(Mode::kFast, s, 0, dinp.data(), GradSink{dw.data()}, dout.data(), x.data(),
                        w.data(), rstd.data());
  check_within("rmsnorm_backward dinp fast", where, dinp, rdinp);
  check_within("rmsnorm_backward dweight fast", where, dw, rdw);

  dinp = dinp0;
  ExactAccumulator acc(static_cast<size_t>(s.C));
  cpu::rmsnorm_backward(Mode::kCanonical, s, 0, dinp.data(), GradSink{nullptr, &acc, 0},
                        dout.data(), x.data(), w.data(), rstd.data());
  const auto gw = rounded(acc, 0, s.C);
  check_within("rmsnorm_backward dinp canonical", where, dinp, rdinp);
  check_within("rmsnorm_backward dweight canonical", where, gw, edw);
  std::vector<float> sdinp = dinp0, sdw(s.C);
  spec::norm_backward(s.N, s.C, sdinp.data(), sdw.data(), nullptr, dout.data(), x.data(), w.data(),
                      nullptr, rstd.data());
  check_bitwise("rmsnorm_backward dinp canonical", where, dinp, sdinp);
  check_bitwise("rmsnorm_backward dweight canonical", where, gw, sdw);
}

// A NaN/Inf in a row poisons exactly that row's outputs and statistics (both norms, both modes).
RC_GTEST_PROP(NormProperty, NonFinitePoisonsExactlyItsRow, ()) {
  const NormShape s{gen_dim(9), gen_dim(70), 1e-5f};
  const std::string where = shape_str({{"N", s.N}, {"C", s.C}});
  const auto x = with_nonfinite(gen_values(s.N * s.C, kSmall));
  const auto w = gen_values(s.C, kSmall), b = gen_values(s.C, kSmall);
  const auto dx = doubles(x), dw = doubles(w), db = doubles(b);
  std::vector<double> rout(s.N * s.C), rmean(s.N), rrstd(s.N), qout(s.N * s.C), qrstd(s.N);
  reference::layernorm_forward<double>(s.N, s.C, s.eps, rout.data(), rmean.data(), rrstd.data(),
                                       dx.data(), dw.data(), db.data());
  reference::rmsnorm_forward<double>(s.N, s.C, s.eps, qout.data(), qrstd.data(), dx.data(), dw.data());
  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = where + " " + std::string(mode_name(mode));
    std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
    cpu::layernorm_forward(mode, s, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data());
    check_nonfinite_pattern("layernorm_forward out", m, out, rout);
    check_nonfinite_pattern("layernorm_forward mean", m, mean, rmean);
    cpu::rmsnorm_forward(mode, s, out.data(), rstd.data(), x.data(), w.data());
    check_nonfinite_pattern("rmsnorm_forward out", m, out, qout);
  }
}

}  // namespace
}  // namespace lockstep::prop
