// ABFT checksums of every linear layer's products while a run trains ([verify] abft): a backend
// that passes each op to the run's own and, after each linear op, checks what it produced —
//
//   forward   out  = inp · Wᵀ (+ bias)     (N × OC, K = IC)
//   dinp      dinp = dout · W              (N × IC, K = OC)
//   dweight   dW  += doutᵀ · inp           (OC × IC, K = N tokens; the increment: after − before)
//
// and the tensor-parallel pieces of canonical mode (the partial sums a rank adds to an exact sum,
// before the group combines them) — by its row checksums against the operands' and thresholds
// derived from them (gemm_checksum.hpp; a failed row is recomputed to locate the element), in both
// modes. The products are the run's, bit
// for bit: the checks only read them. Products are named by their weight (the model's parameter
// names) and kind: `gemm/layer/2/mlp/fc/weight/forward`, `gemm/wte/dinp` (the tied head).
//
// A product hook sees each product after the op and before the check: [inject]'s GEMM-output
// sites act there, so an injected fault stands for a faulty multiply the checksums must catch.
//
// Each rank checks its own products; AbftDetector, a step observer, gathers every rank's worst
// failed check after the gradient reduction (before the update), so every rank reaches the same
// finding, naming the ranks, the product and the element its checksums point at (class
// corruption). Not covered here: attention's score and value products (inside the attention op).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/forwarding_backend.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/model.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/finding.hpp"
#include "verify/detect/gemm_checksum.hpp"

namespace lockstep::detect {

enum class GemmProduct : uint8_t { kForward, kInputGrad, kWeightGrad };
inline constexpr int kGemmProducts = 3;
std::string_view product_name(GemmProduct p);  // "forward" | "dinp" | "dweight"

// The product hook: the product's site name and the product as stored, after the op.
using ProductHook = std::function<void(std::string_view site, const ProductView& product)>;

struct AbftStats {
  int64_t checks = 0;            // products checked
  int64_t faults = 0;            // of them failed
  double seconds = 0;            // spent checking (not in the ops)
  double max_clean_ratio = 0;    // the largest |observed − predicted| / threshold of a passed check: the
                                 // bound's tightness (1 would be a bound met exactly)
};

// A failed check (verdict.fault: of the row checksums) of the product at `site`, and the column of
// the failed row where the fault lies (-1: not located, for a product that accumulates into C).
struct AbftFault {
  int site = 0;
  ChecksumVerdict verdict;
  int64_t col = -1;
};

class AbftBackend final : public ForwardingBackend {
 public:
  // check: run the checksums (else only the product hook sees the products).
  AbftBackend(Backend& inner, bool check) : ForwardingBackend(inner), check_(check) {}

  // Names the products of a weight: data is where the weight lies (a parameter of the model).
  void name_weight(const float* data, int64_t numel, std::string name);
  // Every matrix parameter of the model (this rank's shards).
  void name_weights(const Model& model);
  // "gemm/NAME/forward"; a weight never named: "gemm/unnamed/forward".
  const std::string& site_name(int site) const;

  void set_product_hook(ProductHook hook) { hook_ = std::move(hook); }
  // The worst failed check since the last call (none: verdict.fault is false), and forgets it.
  AbftFault take_worst();
  const AbftStats& stats() const { return stats_; }
  bool checking() const { return check_; }

  void linear_forward(Mode mode, LinearShape s, float* out, const float* inp, const float* weight,
                      const float* bias) override;
  void linear_backward(Mode mode, LinearShape s, int64_t token_offset, float* dinp, GradSink dweight, GradSink dbias,
                       const float* dout, const float* inp, const float* weight) override;
  void linear_forward_partials(LinearShape s, ExactAccumulator& out, const float* inp, const float* weight) override;
  void linear_backward_dinp_partials(LinearShape s, ExactAccumulator& dinp, const float* dout,
                                     const float* weight) override;

 private:
  struct Weight {
    const float* begin;
    const float* end;
    int index;
  };
  // What a weight's last forward learnt of its operands (the row sums of its input and of the
  // weight), reused by its backward: the weights change only between steps, and a backward follows
  // its forward in the same step. A check that finds nothing that fits computes them.
  struct ForwardMemo {
    const float* inp = nullptr;
    int64_t N = 0;
    OperandRowSums sums;
  };
  int site_of(const float* weight, GemmProduct p) const;
  // The memo of a weight's products (a scratch one for an unnamed weight).
  ForwardMemo& memo(int site);
  class Timed;
  // The row sums W·e and inp·e a backward check needs: its forward's (the memo), where they fit.
  const OperandRowSums& weight_rows(int site, const MatrixView& w);
  const OperandRowSums& input_rows(int site, const MatrixView& x);
  // The row checksums of a product that accumulates, before the op.
  void checksums_before(const ProductView& c);
  // The hook, then the row checksums of a forward product c = inp·Wᵀ (+ bias), its memo kept.
  void check_forward(int site, const ProductView& c, LinearShape s, const float* inp, const float* weight,
                     const float* bias, int64_t chain, bool accumulates);
  // The hooks, then the row checksums of a backward's products dx = dout·W and dW += doutᵀ·inp
  // (either may be absent: f32 and exact both null); their sites those of the weight as named.
  void check_backward(bool canonical, LinearShape s, const ProductView& dx, const ProductView& dw, const float* dout,
                      const float* inp, const float* weight, const float* named_weight);
  // An operand of n floats as the products read it: where they read it rounded to bf16 (`round`,
  // LinearShape::round_dout or round_weight) and the checks run, rounded into `copy`, which the
  // products and the checksums both read (`round` then cleared: the products read it as it is).
  const float* as_read(bool& round, const float* x, int64_t n, std::vector<float>& copy);
  // The row checksums of c against `predicted` (from a and b), recorded.
  void conclude(int site, const ProductView& c, const MatrixView& a, const MatrixView& b, ProductRounding rounding,
                bool accumulates, const float* bias, ChecksumVector& predicted);

  bool check_;
  ProductHook hook_;
  std::vector<Weight> weights_;     // sorted by begin
  std::vector<std::string> sites_;  // [weight index · kGemmProducts + product]; unnamed: -1 - product
  ChecksumScratch scratch_;
  std::vector<double> extra_;
  std::vector<float> rounded_dout_, rounded_weight_;
  std::vector<ForwardMemo> memos_;  // per named weight, then one for the unnamed
  OperandRowSums fresh_;            // a backward's row sums where no memo fits
  AbftStats stats_;
  AbftFault worst_;
};

// Reports the failed checks of every rank after the gradient reduction of each step.
class AbftDetector final : public StepObserver {
 public:
  AbftDetector(AbftBackend& abft, comm::Communicator& world, FindingLog& log, FaultAction action)
      : abft_(abft), world_(world), log_(log), action_(action) {}
  void after_reduce(int64_t step, float loss) override;
  void rolled_back(int64_t) override { abft_.take_worst(); }

 private:
  AbftBackend& abft_;
  comm::Communicator& world_;
  FindingLog& log_;
  FaultAction action_;
};

}  // namespace lockstep::detect
