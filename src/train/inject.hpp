// Fault and divergence injection, for tests, demos of `lockstep diff` / `lockstep bisect` and the
// detectors: one planted change at one step and one site, chosen on the command line,
//
//   --inject.site=layer/2/mlp/res --inject.step=7 --inject.kind=bitflip:bit=27[,index=N]
//   --inject.site=layer/1/attn/att --inject.step=7 --inject.kind=order
//   --inject.site=layer/3/mlp/fc --inject.step=7 --inject.kind=cast:bf16
//   --inject.site=param/lnf/weight --inject.step=1 --inject.kind=bitflip:bit=0 --inject.rank=1
//   --inject.kind=exit --inject.step=2 --inject.rank=1       (or kind=hang)
//
// Sites: the model's hook names (src/model/layer.hpp; `grad/...` sites act on the backward), the
// tensor as the step computes it (the first micro-batch's for bitflip); or the state at rest after
// the step's update: `param/NAME`, the parameter NAME, or `optim/m`, `optim/v`, this rank's AdamW
// moments (all of them, or its ZeRO shard; bitflip's index is an element of that buffer); or a
// product of a linear layer, `gemm/WEIGHT/forward|dinp|dweight` (verify/detect/abft.hpp), changed
// as the op leaves it, before any detector sees it — a faulty multiply (bitflip's index is an
// element of the product: forward token·OC + o, dinp token·IC + i, dweight o·IC + i; dweight is the
// gradient the product adds to); or a message as a rank receives it, `comm/dp|tp/OP` (OP
// all_reduce, reduce_scatter, all_gatherv, all_to_allv, broadcast; verify/detect/verified_comm.hpp)
// or `comm/pp/send/recv` (a pipeline stage's activation or gradient),
// before any check sees it — a fault on the wire (bitflip's index is a 32-bit word of what the
// rank received from its peers, its own block of a gather or all-to-all excluded, nth=K the step's
// K-th such message to complete on that rank, 0 the first; the exact reduction's record counts
// complete before its sums).
// Or `optim/grad`, the gradient this rank holds after the reduction (all of it, or its ZeRO-2
// shard), changed before clipping and the update read it (bitflip's index is an element of it).
// Or a file of the checkpoint written after the step, `ckpt/manifest` (manifest.json) or
// `ckpt/tensors` (tensors-00000.bin), changed on disk once written, as a storage fault would
// (bitflip's index is a 32-bit word of the file; world rank 0 writes checkpoints): the loader's
// checksums refuse it, and a resume falls back to the checkpoint before it.
// bitflip: flips one bit of one element, as silent data corruption would;
// order:   runs that op's forward in the other mode (canonical <-> fast): a different but valid
//   accumulation order, the kind of change a new kernel or library brings (hook sites of an op's
//   forward output only);
// cast:F:  rounds every element to F (bf16, f16, e4m3, e5m2) and back, as running that op in a
//   narrower format would;
// FP8 instabilities (src/model/fp8_recipe.hpp), to see the fp8 sentinel raise its alarms:
// outlier:channel=C,growth=G: from `step` on, channel C (an index of the tensor's last dimension)
//   of every micro-batch's tensor is multiplied by G^n in the n-th step (1, 2, ...): an outlier
//   feature that grows, which delayed scaling's amax history lags behind;
// spread:power=P[,index=I]: element I of the step's tensors (every micro-batch's) is multiplied by
//   2^P: a tensor whose range outgrows its format's (with a gradient site, E5M2's);
// fp8_scale:power=P at site fp8/LINEAR/ROLE (e.g. fp8/layer/0/mlp/fc/input): the step's delayed
//   scale of that tensor is multiplied by 2^P, a scale off by a power of two;
// exit, hang (no site): after the step the process ends at once (_exit(9)) or sleeps forever, as
//   a dead or hung rank would;
// slow:ms=N (no site): the step's update takes N ms longer on the rank, as a throttled device or a
//   slow host would make it (with persistent=true, every step from `step` on).
// --inject.rank=R restricts the injection to the process of launcher rank R (a fault on one device:
// the run's rank R, unless `lockstep launch --spares` holds processes back and another took its
// place); by default every rank injects. A fault is transient by default — it happens once, the first time its step runs (a
// rolled-back replay of that step is clean) — or, with --inject.persistent=true, at its step and
// every step after, replays included (a device that stays broken). Under tensor parallelism a rank's tensor is its shard (src/model/hook_layout.hpp
// and param_layout.hpp say where it lies in the global one): bitflip's index is an element of it.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor_view.hpp"
#include "src/model/model.hpp"
#include "src/train/config.hpp"
#include "src/train/step_observer.hpp"
#include "verify/detect/gemm_checksum.hpp"
#include "verify/detect/verified_comm.hpp"

namespace lockstep {

struct Injection {
  enum class Kind { kNone, kBitflip, kOrder, kCast, kOutlier, kSpread, kFp8Scale, kExit, kHang, kSlow };
  Kind kind = Kind::kNone;
  std::string site;
  int64_t step = 0;
  int64_t rank = -1;    // world rank that injects (-1: every rank)
  int bit = 0;          // bitflip
  int64_t index = 0;    // bitflip, spread: element of the tensor (comm/ sites: 32-bit word); outlier: channel
  int64_t nth = 0;      // comm/ sites: which of the step's messages of that operation (0: the first)
  bool persistent = false;  // every step from `step` on, and every replay of it; else once
  bool wrap = false;    // index taken modulo the site's size (a campaign's random faults)
  std::string format;   // cast
  int64_t ms = 0;       // slow: milliseconds added to the step
  double growth = 0;    // outlier: factor per step
  int power = 0;        // spread, fp8_scale: the power of two applied
};

// Parses and checks the [inject] section of a run of `model`; `where` names the config for messages.
Injection parse_injection(const InjectConfig& c, const std::string& where, const ModelConfig& model);
// The faults of a campaign file (JSON lines {"step", "rank", "site", "kind"}, steps increasing: one
// fault a step at most), each checked as [inject] is, their indexes taken modulo the site's size.
std::vector<Injection> parse_campaign(const std::string& path, const ModelConfig& model);

// A site of the state between steps (param/NAME, optim/m, optim/v), changed after the update.
bool is_state_site(const std::string& site);
// A product of a linear layer (gemm/WEIGHT/PRODUCT), changed through the GEMM product hook.
bool is_gemm_site(const std::string& site);
// A received message (comm/GROUP/OP), changed through the verified collectives' receive hook.
bool is_comm_site(const std::string& site);
// A file of a checkpoint (ckpt/manifest, ckpt/tensors), changed once written.
bool is_checkpoint_site(const std::string& site);
// An fp8 tensor's scale (fp8/LINEAR/ROLE), changed at the start of the step.
bool is_fp8_site(const std::string& site);

// Applies an Injection to a model step by step: a step observer (begin_step sets an op's mode,
// after_reduce checks that a hook site was seen, after_update edits a parameter site, end_step
// ends or hangs the process), and on_tensor() from the model's hook. A hook site that never
// appeared in the injection step is an error: a misspelt name must not pass silently.
class Injector final : public StepObserver {
 public:
  // schedule: the faults, one a step at most (one [inject], or a campaign's); world_rank: this
  // process's launcher rank, where only faults for it (or for every rank) act. m, v: this rank's AdamW
  // moments (the optim/ sites).
  // reduced_grads: the gradient after the reduction (optim/grad), asked for when it is changed.
  Injector(std::vector<Injection> schedule, int64_t world_rank, Model& model, std::span<float> m, std::span<float> v,
           std::function<std::span<float>()> reduced_grads);

  // The model needs its hook for these faults.
  bool watches_tensors() const;
  void on_tensor(std::string_view name, const TensorView& t);
  // The GEMM product hook (verify/detect/abft.hpp) is needed for these faults.
  bool watches_products() const;
  void on_product(std::string_view site, const detect::ProductView& product);
  // The collectives' receive hook (verify/detect/verified_comm.hpp) is needed for these faults.
  bool watches_messages() const;
  void on_received(std::string_view group, std::string_view op, std::span<const detect::ReceivedBytes> blocks);
  // A checkpoint was written to `dir` after step_done steps (world rank 0).
  void on_checkpoint(const std::string& dir, int64_t step_done);
  // Whether fault i of the schedule acted on this rank in some run of its step.
  bool applied(size_t i) const { return applied_fault_[i]; }
  // Whether some fault of the schedule is for this rank (its process, and its stage's sites).
  bool acts_here() const;
  void begin_step(int64_t step) override;
  void after_reduce(int64_t step, float loss) override;
  void after_update(int64_t step) override;
  void end_step(const StepRecord& r) override;

 private:
  // Whether fault f is one of a hook site.
  static bool at_tensor(const Injection& f);
  // Some fault of the schedule acts on this rank at such a site.
  bool watches(bool (*at)(const Injection&)) const;
  // Applies the bitflip, cast, outlier or spread to n elements at data (last_dim: the tensor's
  // innermost extent, the channels of an outlier).
  void apply(std::string_view name, float* data, int64_t n, int64_t last_dim = 1);
  // The element of n a bitflip acts on.
  int64_t element(int64_t n) const { return inj_.wrap ? inj_.index % n : inj_.index; }
  std::vector<Injection> schedule_;
  // Per fault: whether it acts on this rank — its process, and a site this model holds (a pipeline
  // stage acts only on its layers' sites).
  std::vector<bool> here_;
  std::vector<bool> done_;  // a transient fault has had its step
  std::vector<bool> applied_fault_;
  size_t current_ = 0;      // this step's fault, when now_
  Injection inj_;           // this step's fault (kind none: none)
  int64_t rank_ = 0;
  Model& model_;
  std::span<float> m_, v_;
  std::function<std::span<float>()> reduced_grads_;
  bool now_ = false;      // a fault acts in this step
  int64_t step_ = 0;      // the step running
  bool applied_ = false;  // the site was seen (bitflip: already flipped)
  int64_t seen_ = 0;      // comm/ sites: messages of that operation received this step
  std::mutex received_mutex_;
};

}  // namespace lockstep
