// The GEMM checksums (verify/detect/gemm_checksum.hpp, abft.hpp) on the CPU backend's own linear
// ops: they change no bit of any product; clean products never fail, over shapes around the chunk
// and tile sizes, both modes, magnitudes spread over binades and rows that cancel, and the worst
// of them comes within a few times of its threshold (a bound that is rigorous, not slack); a flipped bit
// whose change exceeds the row's threshold fails its product — named, its row found and, for a
// product that overwrites C, its column — while a last-bit flip stays below it; the detector turns
// a failed check into a finding (warn) or a stop (exit 6).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "src/comm/communicator.hpp"
#include "tests/support/random_values.hpp"
#include "verify/detect/abft.hpp"

namespace lockstep::detect {
namespace {

struct Operands {
  LinearShape s;
  std::vector<float> inp, weight, bias, dout;
};

// Values over binades, and (cancel) rows whose entries nearly sum to zero: the checksums then
// sit far below their magnitudes, the hardest case for a threshold that must not fire.
Operands operands(LinearShape s, uint64_t seed, bool cancel) {
  std::mt19937_64 g(seed);
  Operands o{s, {}, {}, {}, {}};
  auto fill = [&](std::vector<float>& v, int64_t rows, int64_t cols) {
    v.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float x = test::random_value(g, 6);
        if (cancel && c % 2 == 1) x = -v[static_cast<size_t>(r * cols + c - 1)] * (1.0f + 0x1p-20f);
        v[static_cast<size_t>(r * cols + c)] = x;
      }
    }
  };
  fill(o.inp, s.N, s.IC);
  fill(o.weight, s.OC, s.IC);
  fill(o.bias, 1, s.OC);
  fill(o.dout, s.N, s.OC);
  return o;
}

const LinearShape kShapes[] = {{1, 1, 1},    {3, 5, 7},     {64, 64, 64},  {65, 63, 129},
                               {128, 200, 96}, {130, 1030, 17}, {256, 64, 1100}};

float flip(float x, int bit) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) ^ (1u << bit)); }

// Runs forward and backward of one linear layer through `be` (fast: fp32 sinks; canonical: exact
// sinks), returning every output for comparison.
std::vector<float> run_linear(Backend& be, Mode mode, const Operands& o) {
  const LinearShape s = o.s;
  std::vector<float> out(static_cast<size_t>(s.N * s.OC)), dinp(static_cast<size_t>(s.N * s.IC));
  be.linear_forward(mode, s, out.data(), o.inp.data(), o.weight.data(), o.bias.data());
  std::vector<float> dw(static_cast<size_t>(s.OC * s.IC), 0.5f), db(static_cast<size_t>(s.OC), 0.0f);
  ExactAccumulator acc(static_cast<size_t>(s.OC * s.IC + s.OC));
  if (mode == Mode::kFast) {
    be.linear_backward(mode, s, 0, dinp.data(), GradSink{dw.data()}, GradSink{db.data()}, o.dout.data(),
                       o.inp.data(), o.weight.data());
    be.linear_backward(mode, s, 0, nullptr, GradSink{dw.data()}, GradSink{}, o.dout.data(), o.inp.data(),
                       o.weight.data());  // accumulating onto a non-zero gradient
  } else {
    for (int rep = 0; rep < 2; ++rep) {
      be.linear_backward(mode, s, 0, rep == 0 ? dinp.data() : nullptr, GradSink{nullptr, &acc, 0},
                         GradSink{nullptr, &acc, s.OC * s.IC}, o.dout.data(), o.inp.data(), o.weight.data());
    }
    acc.round_to(0, static_cast<size_t>(s.OC * s.IC), dw.data());
  }
  std::vector<float> all = out;
  all.insert(all.end(), dinp.begin(), dinp.end());
  all.insert(all.end(), dw.begin(), dw.end());
  return all;
}

TEST(Abft, ChangesNoBitAndCleanProductsPass) {
  CpuBackend cpu = CpuBackend::current();
  double tightest = 0;
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (const LinearShape& s : kShapes) {
      for (bool cancel : {false, true}) {
        const Operands o = operands(s, 1000 + s.N + s.IC + s.OC, cancel);
        AbftBackend abft(cpu, true);
        abft.name_weight(o.weight.data(), s.OC * s.IC, "w");
        const std::vector<float> plain = run_linear(cpu, mode, o), checked = run_linear(abft, mode, o);
        ASSERT_EQ(plain.size(), checked.size());
        EXPECT_EQ(0, std::memcmp(plain.data(), checked.data(), plain.size() * sizeof(float)))
            << mode_name(mode) << " " << s.N << "x" << s.IC << "x" << s.OC;
        EXPECT_EQ(abft.stats().faults, 0) << mode_name(mode) << " " << s.N << "x" << s.IC << "x" << s.OC
                                          << " cancel " << cancel << ": " << abft.site_name(abft.take_worst().site);
        EXPECT_EQ(abft.stats().checks, 4);  // forward, dinp, dW twice
        EXPECT_LT(abft.stats().max_clean_ratio, 1.0);
        tightest = std::max(tightest, abft.stats().max_clean_ratio);
      }
    }
  }
  // The thresholds are rigorous, not loose: on the small shapes the observed rounding comes within
  // a few times of them (0.1 to 0.4 of the threshold).
  EXPECT_GT(tightest, 0.1);
}

// The tensor-parallel pieces of canonical mode add to an exact sum that is not empty.
TEST(Abft, PartialsPassCleanAndFailWhenCorrupted) {
  CpuBackend cpu = CpuBackend::current();
  const LinearShape s{96, 128, 80};
  const Operands o = operands(s, 7, false);
  for (bool corrupt : {false, true}) {
    AbftBackend abft(cpu, true);
    abft.name_weight(o.weight.data(), s.OC * s.IC, "layer/0/attn/proj/weight");
    if (corrupt) {
      abft.set_product_hook([&](std::string_view site, const ProductView& p) {
        if (site == "gemm/layer/0/attn/proj/weight/forward") p.exact->add(5 * p.N + 3, 1e6);
      });
    }
    ExactAccumulator out(static_cast<size_t>(s.N * s.OC)), dinp(static_cast<size_t>(s.N * s.IC));
    for (int64_t i = 0; i < s.N * s.OC; ++i) out.add(static_cast<size_t>(i), 0.25 * static_cast<double>(i % 7));
    abft.linear_forward_partials(s, out, o.inp.data(), o.weight.data());
    abft.linear_backward_dinp_partials(s, dinp, o.dout.data(), o.weight.data());
    const AbftFault f = abft.take_worst();
    EXPECT_EQ(f.verdict.fault, corrupt);
    if (corrupt) {
      EXPECT_EQ(abft.site_name(f.site), "gemm/layer/0/attn/proj/weight/forward");
      EXPECT_EQ(f.verdict.index, 5);
      EXPECT_EQ(f.col, -1);  // the product accumulates: the row only
    }
  }
}

// A flip of bit `bit` of element (row, col) of each product, through the product hook as [inject]
// does: above the threshold it fails that product at that element; a last-bit flip does not.
TEST(Abft, FlippedBitsFailTheirProductAtTheirElement) {
  CpuBackend cpu = CpuBackend::current();
  const LinearShape s{130, 200, 96};
  const Operands o = operands(s, 11, false);
  struct Case {
    GemmProduct product;
    int64_t row, col;
  };
  for (Mode mode : {Mode::kCanonical, Mode::kFast}) {
    for (const Case& c : {Case{GemmProduct::kForward, 17, 33}, Case{GemmProduct::kInputGrad, 129, 199},
                          Case{GemmProduct::kWeightGrad, 95, 0}}) {
      for (int bit : {0, 22, 26, 30}) {
        AbftBackend abft(cpu, true);
        abft.name_weight(o.weight.data(), s.OC * s.IC, "layer/1/mlp/fc/weight");
        const std::string site = std::string("gemm/layer/1/mlp/fc/weight/") + std::string(product_name(c.product));
        double change = 0;
        bool flipped = false;  // once: the first product of that site, as a transient fault
        abft.set_product_hook([&](std::string_view name, const ProductView& p) {
          if (name != site || flipped) return;
          flipped = true;
          const int64_t e = c.row * p.N + c.col;
          if (p.f32 != nullptr) {
            const float was = p.f32[e];
            p.f32[e] = flip(was, bit);
            change = std::fabs(static_cast<double>(p.f32[e]) - was);
          } else {
            const float was = p.exact->round(static_cast<size_t>(p.offset + e));
            const double delta = static_cast<double>(flip(was, bit)) - was;
            p.exact->add(static_cast<size_t>(p.offset + e), delta);
            change = std::fabs(delta);
          }
        });
        run_linear(abft, mode, o);
        const AbftFault f = abft.take_worst();
        const std::string what = str_cat(mode_name(mode), " ", site, " bit ", bit, " change ", change);
        if (bit == 0) {
          EXPECT_FALSE(f.verdict.fault) << what;
          continue;
        }
        ASSERT_TRUE(f.verdict.fault) << what << " ratio " << f.verdict.ratio;
        EXPECT_EQ(abft.site_name(f.site), site) << what;
        EXPECT_EQ(f.verdict.index, c.row) << what;
        EXPECT_EQ(f.col, c.product == GemmProduct::kWeightGrad ? -1 : c.col) << what;
        EXPECT_NEAR(f.verdict.diff, change, 1e-3 * change + f.verdict.threshold) << what;
      }
    }
  }
}

TEST(Abft, UnnamedWeightsAndTheHookWithoutChecks) {
  CpuBackend cpu = CpuBackend::current();
  const LinearShape s{8, 16, 4};
  const Operands o = operands(s, 3, false);
  AbftBackend abft(cpu, false);
  std::vector<std::string> seen;
  abft.set_product_hook([&](std::string_view site, const ProductView&) { seen.emplace_back(site); });
  run_linear(abft, Mode::kFast, o);
  EXPECT_EQ(seen, (std::vector<std::string>{"gemm/unnamed/forward", "gemm/unnamed/dinp", "gemm/unnamed/dweight",
                                            "gemm/unnamed/dweight"}));
  EXPECT_EQ(abft.stats().checks, 0);
}

TEST(AbftDetector, ReportsTheFailedProductOrStops) {
  CpuBackend cpu = CpuBackend::current();
  const LinearShape s{16, 32, 8};
  const Operands o = operands(s, 5, false);
  comm::SelfCommunicator self;
  for (FaultAction action : {FaultAction::kWarn, FaultAction::kStop}) {
    AbftBackend abft(cpu, true);
    abft.name_weight(o.weight.data(), s.OC * s.IC, "lm_head/weight");
    abft.set_product_hook([&](std::string_view site, const ProductView& p) {
      if (site == "gemm/lm_head/weight/forward") p.f32[2 * p.N + 5] = flip(p.f32[2 * p.N + 5], 29);
    });
    std::ostringstream out;
    FindingLog log(out, {});
    AbftDetector detector(abft, self, log, action);
    run_linear(abft, Mode::kFast, o);
    if (action == FaultAction::kStop) {
      try {
        detector.after_reduce(3, 1.0f);
        ADD_FAILURE() << "no stop";
      } catch (const FaultStop& e) {
        EXPECT_EQ(e.exit_code(), kExitCorruption);
      }
    } else {
      detector.after_reduce(3, 1.0f);
      detector.after_reduce(4, 1.0f);  // nothing failed since: no second finding
    }
    EXPECT_EQ(log.count(), 1);
    const std::string line = out.str();
    EXPECT_NE(line.find("finding: after step 4, detector abft, site gemm/lm_head/weight/forward, ranks 0"),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("token 2 fails, at output feature 5"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace lockstep::detect
