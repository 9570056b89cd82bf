// Properties of the token + position embedding, forward and backward (dwte, dwpe), both modes:
// within the Bounded<double> reference's bound (reference/embedding.hpp; order-free token sums),
// canonical mode bitwise equal to spec.hpp (chains per chunk of 64 global tokens, exact combine).
//
// Token ids are drawn from a small vocabulary, so rows repeat across chunks; B·T reaches 200
// (several chunks). Forward values reach 2^127 (wte + wpe may round to ±inf: demanded exactly
// beyond the overflow threshold); dout stays below 2^100 so that token sums cannot overflow.
#include <string>
#include <vector>

#include "kernels/ops/embedding.hpp"
#include "reference/embedding.hpp"
#include "src/core/exact_sum.hpp"
#include "tests/property/spec.hpp"
#include "tests/property/support.hpp"

namespace lockstep::prop {
namespace {


RC_GTEST_PROP(EmbeddingProperty, ForwardBackwardWithinBoundAndCanonicalBitwise, ()) {
  EmbeddingShape s{};
  s.B = gen_dim(5);
  s.T = gen_dim(67);
  s.C = gen_dim(13);
  s.V = gen_dim(17);
  const bool with_wpe = *rc::gen::arbitrary<bool>();
  const std::string where =
      shape_str({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"V", s.V}, {"wpe", with_wpe}});
  const int64_t N = s.B * s.T;
  const auto tokens = *rc::gen::container<std::vector<int32_t>>(
      static_cast<size_t>(N), rc::gen::inRange<int32_t>(0, static_cast<int32_t>(s.V)));
  const auto wte = gen_values(s.V * s.C, {3, true, true, 127});
  const auto wpe = gen_values(s.T * s.C, {3, true, true, 127});
  const auto dout = gen_values(N * s.C, {3, true, true, 100});
  const auto dwte0 = gen_values(s.V * s.C), dwpe0 = gen_values(s.T * s.C);

  const auto bte = bounded<double>(wte), bpe = bounded<double>(wpe), bdo = bounded<double>(dout);
  std::vector<BD> rout(N * s.C);
  reference::embedding_forward(s.B, s.T, s.C, s.V, rout.data(), tokens.data(), bte.data(),
                               with_wpe ? bpe.data() : nullptr);
  std::vector<float> sout(N * s.C);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < s.C; ++c) {
      const float e = wte[tokens[n] * s.C + c];
      sout[n * s.C + c] = with_wpe ? e + wpe[(n % s.T) * s.C + c] : e;
    }
  }
  // Fast mode adds every token into the existing gradient (`+=` per token); the reference's
  // Bounded gradients take the existing value as one more term of the order-free sum
  // (reference/reduce.hpp), so they start from dwte0 and dwpe0.
  std::vector<BD> rdte = bounded<double>(dwte0), rdpe = bounded<double>(dwpe0);
  reference::embedding_backward(s.B, s.T, s.C, s.V, rdte.data(), with_wpe ? rdpe.data() : nullptr,
                                bdo.data(), tokens.data());
  std::vector<BD> edte(s.V * s.C, BD(0.0)), edpe(s.T * s.C, BD(0.0));
  reference::embedding_backward(s.B, s.T, s.C, s.V, edte.data(), edpe.data(), bdo.data(),
                                tokens.data());
  std::vector<float> sdte(s.V * s.C), sdpe(s.T * s.C);
  spec::embedding_backward(s.B, s.T, s.C, s.V, sdte.data(), sdpe.data(), dout.data(), tokens.data());

  for (Mode mode : {Mode::kFast, Mode::kCanonical}) {
    const std::string m = std::string(mode_name(mode));
    std::vector<float> out(N * s.C);
    cpu::embedding_forward(mode, s, out.data(), tokens.data(), wte.data(),
                           with_wpe ? wpe.data() : nullptr);
    check_within("embedding_forward out " + m, where, out, rout);
    check_bitwise("embedding_forward out " + m, where, out, sout);  // one add: exact in both modes
  }

  std::vector<float> dte = dwte0, dpe = dwpe0;
  cpu::embedding_backward(Mode::kFast, s, 0, GradSink{dte.data()},
                          with_wpe ? GradSink{dpe.data()} : GradSink{}, dout.data(), tokens.data());
  check_within("embedding_backward dwte fast", where, dte, rdte);
  if (with_wpe) check_within("embedding_backward dwpe fast", where, dpe, rdpe);

  ExactAccumulator acc(static_cast<size_t>(s.V * s.C + s.T * s.C));
  cpu::embedding_backward(Mode::kCanonical, s, 0, GradSink{nullptr, &acc, 0},
                          GradSink{nullptr, &acc, s.V * s.C}, dout.data(), tokens.data());
  std::vector<float> grads(acc.size());
  acc.round_to(grads.data());
  const std::vector<float> gte(grads.begin(), grads.begin() + s.V * s.C),
      gpe(grads.begin() + s.V * s.C, grads.end());
  check_within("embedding_backward dwte canonical", where, gte, edte);
  check_within("embedding_backward dwpe canonical", where, gpe, edpe);
  check_bitwise("embedding_backward dwte canonical", where, gte, sdte);
  check_bitwise("embedding_backward dwpe canonical", where, gpe, sdpe);
}

}  // namespace
}  // namespace lockstep::prop
