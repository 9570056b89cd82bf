#include "verify/step.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "reference/canonical_f32.hpp"
#include "reference/gpt.hpp"
#include "reference/real.hpp"
#include "reference/schedule.hpp"
#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/data/sampler.hpp"
#include "src/data/token_file.hpp"
#include "src/model/model.hpp"
#include "src/optim/adamw.hpp"
#include "src/optim/grad_clip.hpp"
#include "verify/core/bounds.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace lockstep::verify {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A tensor as observed: fp32 data of the whole batch (micro-batches concatenated on dim 0).
struct Observed {
  std::vector<float> data;
  std::vector<int64_t> shape;
};

// The reference's tensors: fp32 values (CanonicalF32) or values with bounds (Bounded<mpfr>).
struct RefTensor {
  std::vector<float> f32;
  std::vector<double> value, bound;
};

template <class Real>
void convert(const Real* x, int64_t n, RefTensor& out) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Real, reference::CanonicalF32>) {
      out.f32.push_back(x[i].v);
    } else {
      out.value.push_back(static_cast<double>(x[i].value));
      // Rounded up, so that the bound stays rigorous after the conversion to double.
      out.bound.push_back(std::nextafter(static_cast<double>(x[i].err),
                                         std::numeric_limits<double>::infinity()));
    }
  }
}

// A value the reference computes exactly: equal bits in either mode.
void exact_value(float x, RefTensor& out) {
  out.f32.push_back(x);
  out.value.push_back(x);
  out.bound.push_back(0.0);
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

// The trainer's step (src/train/trainer.cpp's loop body), every tensor observed.
std::map<std::string, Observed> run_trainer(const StepState& s, const StepSetup& u, Backend& backend,
                                            std::vector<std::string>& order) {
  const TrainConfig& tc = s.cfg.train;
  Model model(s.model, tc.mode, u.MB, {.backend = &backend, .precision = tc.precision_recipe()});
  const auto ref_layout = reference::reference_param_layout(s.model);
  LS_CHECK(ref_layout.size() == model.param_layout().size(), "reference layout has ",
           ref_layout.size(), " tensors, the model ", model.param_layout().size());
  for (size_t i = 0; i < ref_layout.size(); ++i) {
    const auto& a = ref_layout[i];
    const auto& b = model.param_layout()[i];
    LS_CHECK(a.name == b.name && a.offset == b.offset && a.numel == b.numel && a.klass == b.klass,
             "reference parameter ", a.name, " does not match the model's ", b.name);
  }
  std::copy(s.params.begin(), s.params.end(), model.params());
  if (model.fp8() != nullptr && !s.fp8.is_null()) model.fp8()->restore(s.fp8);
  for (auto& [layer, bias] : selection_biases(s)) model.moe_selection_biases().at(layer) = bias;
  AdamW opt(model, tc.adamw());
  opt.m() = s.m;
  opt.v() = s.v;

  std::map<std::string, Observed> seen;
  model.set_hook([&](std::string_view name, const TensorView& t) {
    const float* data = t.f32();
    const std::span<const int64_t> shape = t.shape.dims();
    auto [it, fresh] = seen.try_emplace(std::string(name));
    Observed& o = it->second;
    if (fresh) {
      order.emplace_back(name);
      o.shape.assign(shape.begin(), shape.end());
    } else {
      o.shape[0] += shape[0];  // the next micro-batch of the same tensor
    }
    o.data.insert(o.data.end(), data, data + numel({shape.begin(), shape.end()}));
  });
  model.zero_grad();
  ChunkCombiner loss_sum;
  const int64_t T = u.T;
  model.forward_backward_batch(s.inputs.data(), s.targets.data(), u.B, u.MB, 0, u.dloss, loss_sum);
  model.finish_grads();
  model.set_hook({});
  const float loss = loss_sum.finish() / static_cast<float>(u.B * T);
  seen["loss"] = {{loss}, {}};
  for (const auto& p : model.param_layout()) {
    seen["grad/" + p.name] = {{model.grads() + p.offset, model.grads() + p.offset + p.numel},
                              p.shape};
  }
  const float norm = clip_grad_norm(model, static_cast<float>(tc.grad_clip));
  seen["grad_norm"] = {{norm}, {}};
  const auto lr = static_cast<float>(LrSchedule{tc.lr, tc.min_lr, tc.warmup, tc.steps}.at(s.step));
  const AdamWConfig adamw = tc.adamw();
  seen["hyper/lr"] = {{lr}, {}};
  seen["hyper/bias_correction1"] = {{adamw_bias_correction(adamw.beta1, s.step + 1)}, {}};
  seen["hyper/bias_correction2"] = {{adamw_bias_correction(adamw.beta2, s.step + 1)}, {}};
  opt.update(model, lr, s.step + 1);
  for (const auto& p : model.param_layout()) {
    seen["param/" + p.name] = {{model.params() + p.offset, model.params() + p.offset + p.numel},
                               p.shape};
    seen["optim/m/" + p.name] = {{opt.m().data() + p.offset, opt.m().data() + p.offset + p.numel},
                                 p.shape};
    seen["optim/v/" + p.name] = {{opt.v().data() + p.offset, opt.v().data() + p.offset + p.numel},
                                 p.shape};
  }
  return seen;
}

// anchor: after each observed tensor, continue from the trainer's values (op-local bounds).
template <class Real>
std::map<std::string, RefTensor> run_reference(const StepState& s, const StepSetup& u,
                                               const std::map<std::string, Observed>& trainer,
                                               bool anchor) {
  reference::GptReference<Real> ref(s.model, u.B, s.cfg.train.precision_recipe());
  ref.fp8_scales = fp8_scales(s);
  ref.selection_biases = selection_biases(s);
  for (size_t i = 0; i < s.params.size(); ++i) {
    ref.params[i] = Real(s.params[i]);
    ref.m[i] = Real(s.m[i]);
    ref.v[i] = Real(s.v[i]);
  }
  std::map<std::string, RefTensor> out;
  auto hook = [&](std::string_view name, Real* data, const std::vector<int64_t>& shape) {
    const int64_t n = numel(shape);
    convert(data, n, out[std::string(name)]);
    if (!anchor) return;
    const std::vector<float>& x = trainer.at(std::string(name)).data;
    LS_CHECK(static_cast<int64_t>(x.size()) == n, name, ": trainer has ", x.size(), " elements");
    for (int64_t i = 0; i < n; ++i) data[i] = Real(x[i]);
  };
  const Real loss = ref.forward_backward(s.inputs.data(), s.targets.data(), u.loss_segments,
                                         u.dloss, hook);
  convert(&loss, 1, out["loss"]);
  for (const auto& p : ref.layout()) {
    convert(ref.grads().data() + p.offset, p.numel, out["grad/" + p.name]);
    if (!anchor) continue;
    const std::vector<float>& g = trainer.at("grad/" + p.name).data;
    for (int64_t i = 0; i < p.numel; ++i) ref.grads()[p.offset + i] = Real(g[i]);
  }
  const Real norm = ref.clip_and_update(u.hyper);
  convert(&norm, 1, out["grad_norm"]);
  for (const auto& [name, x] : {std::pair{"hyper/lr", u.hyper.lr}, std::pair{"hyper/bias_correction1", u.hyper.bc1},
                                std::pair{"hyper/bias_correction2", u.hyper.bc2}})
    exact_value(x, out[name]);
  for (const auto& p : ref.layout()) {
    convert(ref.params.data() + p.offset, p.numel, out["param/" + p.name]);
    convert(ref.m.data() + p.offset, p.numel, out["optim/m/" + p.name]);
    convert(ref.v.data() + p.offset, p.numel, out["optim/v/" + p.name]);
  }
  return out;
}

// Layer of an activation row (`layer/3/...` or `grad/layer/3/...`), -1 for others.
int64_t layer_of(const std::string& name) {
  const std::string key = "layer/";
  const size_t at = name.rfind(key, 5);
  if (at != 0 && at != 5) return -1;
  if (at == 5 && name.compare(0, 5, "grad/") != 0) return -1;
  return std::stoll(name.substr(at + key.size()));
}

// Seconds per multiply-add of reference::dot in Real, measured on a short vector.
template <class Real>
double seconds_per_fma() {
  constexpr int64_t n = 1024;
  std::vector<Real> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = Real(1.0f + static_cast<float>(i) * 0x1p-10f);
    b[i] = Real(1.0f - static_cast<float>(i) * 0x1p-11f);
  }
  int64_t reps = 0;
  const auto t0 = Clock::now();
  double sink = 0;
  do {
    sink += reference::value_of(reference::dot(a.data(), 1, b.data(), 1, n));
    ++reps;
  } while (seconds_since(t0) < 0.02);
  const double t = seconds_since(t0);
  return sink == 0 ? t : t / static_cast<double>(reps * n);
}

}  // namespace

namespace {

// The step's global batch from a sampler at the step's position.
void read_batch(const RunConfig& cfg, data::TrainSampler& sampler, StepState& s) {
  const int64_t BT = cfg.train.batch_size * cfg.model.seq_len;
  s.inputs.resize(BT);
  s.targets.resize(BT);
  sampler.next_batch(cfg.train.batch_size, 0, cfg.train.batch_size, s.inputs.data(), s.targets.data());
}

}  // namespace

std::map<std::string, float> fp8_scales(const StepState& s) {
  const PrecisionRecipe recipe = s.cfg.train.precision_recipe();
  if (recipe.linears != Precision::kFp8) return {};
  std::vector<std::string> linears;
  for (const std::string& l : linear_names(s.model)) {
    if (recipe.fp8_linear(l)) linears.push_back(l);
  }
  Fp8State state(recipe.fp8, linears);
  if (!s.fp8.is_null()) state.restore(s.fp8);
  std::map<std::string, float> out;
  for (size_t i = 0; i < state.size(); ++i) out[state.name(i)] = state.scale(i);
  return out;
}

std::map<std::string, std::vector<float>> selection_biases(const StepState& s) {
  std::map<std::string, std::vector<float>> out;
  for (const LayerDesc& l : s.model.layers) {
    if (l.kind != LayerKind::kMoe || !l.selection_bias) continue;
    const std::string key = l.prefix + "moe";
    const auto it = s.moe_biases.find(key);
    out[key] = it != s.moe_biases.end() ? it->second : std::vector<float>(static_cast<size_t>(l.experts), 0.0f);
    LS_REQUIRE(static_cast<int64_t>(out[key].size()) == l.experts, "the checkpoint's selection biases of ", key,
               " are ", out[key].size(), ", the model has ", l.experts, " experts");
  }
  return out;
}

StepSetup step_setup(const StepState& s) {
  const TrainConfig& tc = s.cfg.train;
  StepSetup u;
  u.B = tc.batch_size;
  u.MB = tc.micro_batch();
  u.T = s.cfg.model.seq_len;
  u.dloss = 1.0f / static_cast<float>(u.B * u.T);  // as trainer.cpp
  for (int64_t mb = 0; mb <= u.B / u.MB; ++mb) u.loss_segments.push_back(mb * u.MB * u.T);
  // The reference's own hyper-parameters, from [train]'s numbers (reference/schedule.hpp); the
  // trainer's come from src/optim in run_trainer, and the hyper/ rows compare the two.
  const reference::ScheduleSpec schedule{tc.lr, tc.min_lr, tc.warmup, tc.steps};
  u.hyper.lr = reference::to_f32(reference::schedule_lr_exact(schedule, s.step));
  u.hyper.beta1 = static_cast<float>(tc.beta1);
  u.hyper.beta2 = static_cast<float>(tc.beta2);
  u.hyper.eps = static_cast<float>(tc.eps);
  u.hyper.weight_decay = static_cast<float>(tc.weight_decay);
  u.hyper.decay_classes = reference::decayed_classes(tc.weight_decay_on);
  u.hyper.bc1 = reference::to_f32(reference::bias_correction_exact(u.hyper.beta1, s.step + 1));
  u.hyper.bc2 = reference::to_f32(reference::bias_correction_exact(u.hyper.beta2, s.step + 1));
  u.hyper.grad_clip = static_cast<float>(tc.grad_clip);
  u.hyper.bf16_params = tc.precision_recipe().bf16_params();
  u.hyper.seed = tc.seed;
  u.hyper.step = static_cast<uint32_t>(s.step + 1);
  return u;
}


StepState initial_step_state(const RunConfig& cfg) {
  StepState s;
  s.cfg = cfg;
  s.model = describe_model(cfg.model);
  Model model(s.model, cfg.train.mode, 1);
  model.init_parameters();
  s.params.assign(model.params(), model.params() + model.num_params());
  s.m.assign(s.params.size(), 0.0f);
  s.v.assign(s.params.size(), 0.0f);
  data::TokenFile train_file(cfg.data.train);
  train_file.check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
  data::TrainSampler sampler(train_file, cfg.model.seq_len, cfg.train.seed);
  read_batch(cfg, sampler, s);
  return s;
}

StepState load_step_state(const RunConfig& cfg, const std::string& dir) {
  std::optional<ckpt::Checkpoint> ck;
  if (!ckpt::list_checkpoints(dir).empty()) {
    std::ostringstream warnings;
    ck = ckpt::load_latest(dir, warnings);
    if (!ck) throw DataError(str_cat(dir, ": no checkpoint under this root loads: ", warnings.str()));
  } else {
    ck = ckpt::load(dir);
  }
  const nlohmann::json now = cfg.to_json();
  const nlohmann::json& then = ck->state.at("config");
  const std::string model = model_config_difference(then, now, "the config");
  LS_REQUIRE(model.empty(), ck->dir, ": was written with [model] ", model, " (verify with the config the run used)");
  StepState s;
  s.cfg = cfg;
  s.model = describe_model(cfg.model);
  s.step = ck->state.at("step").get<int64_t>();
  const std::vector<ParamTensor> layout = build_param_layout(s.model);
  const auto n = static_cast<size_t>(layout.back().offset + layout.back().numel);
  s.params.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  for (const auto& p : layout) {
    ck->copy_to(ckpt::kModelPrefix + p.name, DType::kF32, p.shape, s.params.data() + p.offset);
    ck->copy_to("optim/m/" + p.name, DType::kF32, p.shape, s.m.data() + p.offset);
    ck->copy_to("optim/v/" + p.name, DType::kF32, p.shape, s.v.data() + p.offset);
  }
  data::TokenFile train_file(cfg.data.train);
  train_file.check_vocab(static_cast<int32_t>(cfg.model.vocab_size));
  data::TrainSampler sampler(train_file, cfg.model.seq_len, cfg.train.seed);
  sampler.restore(ck->state.at("sampler").get<data::SamplerState>());
  read_batch(cfg, sampler, s);
  const nlohmann::json& observers = ck->state.value("observers", nlohmann::json::object());
  if (observers.contains("fp8")) s.fp8 = observers.at("fp8");
  if (observers.contains("moe") && !observers.at("moe").is_null()) {
    s.moe_biases = observers.at("moe").get<std::map<std::string, std::vector<float>>>();
  }
  return s;
}

double estimate_reference_seconds(const RunConfig& cfg, const StepOptions& opt) {
  const double flops = flops_per_token(describe_model(cfg.model)) *
                       static_cast<double>(cfg.train.batch_size * cfg.model.seq_len);
  double per_fma;
  if (cfg.train.mode == Mode::kCanonical) {
    per_fma = seconds_per_fma<reference::CanonicalF32>();
  } else if (opt.reference_type == ReferenceType::kDouble) {
    per_fma = seconds_per_fma<reference::Bounded<double>>();
  } else {
    reference::ScopedMpfrBits bits(opt.reference_bits);
    per_fma = seconds_per_fma<reference::MpfrBounded>();
  }
  return flops / 2 * per_fma;  // two FLOPs per multiply-add
}

namespace {

// ", probabilistic bounds (λ = 6: ...)" for the report's reference line: the probability that the
// longest reduction of the step stays within its bound, under the model's assumption.
std::string probabilistic(const StepState& s, double lambda, double u) {
  if (lambda <= 0) return "";
  const ModelConfig& m = s.cfg.model;
  const int64_t longest = std::max({m.d_model, m.ffn_width(), m.vocab_size, s.cfg.train.batch_size * m.seq_len});
  return str_cat(", probabilistic bounds (lambda = ", lambda, ": each n-term reduction within gamma~_n(lambda), ",
                 "with probability at least 1 - 2n exp(-lambda^2 (1-u)^2 / 2) if its roundings are independent; ",
                 "for the longest, n = ", longest, ": ", bounds::gamma_probabilistic_confidence(longest, u, lambda),
                 "; not a worst-case bound)");
}

std::string reference_name(const RunConfig& cfg, const StepOptions& opt) {
  if (cfg.train.mode == Mode::kCanonical) return "CanonicalF32";
  if (opt.reference_type == ReferenceType::kDouble) return "Bounded<double>";
  return "Bounded<mpfr " + std::to_string(opt.reference_bits) + " bits>";
}

}  // namespace

StepReport verify_step(const StepState& s, const StepOptions& opt) {
  const TrainConfig& tc = s.cfg.train;
  const bool canonical = tc.mode == Mode::kCanonical;
  if (!opt.force) {
    const double est = estimate_reference_seconds(s.cfg, opt);
    std::string faster;
    if (!canonical && opt.reference_type == ReferenceType::kMpfr) {
      StepOptions dbl = opt;
      dbl.reference_type = ReferenceType::kDouble;
      faster = str_cat(", --reference.type=double (estimated ",
                       static_cast<int64_t>(estimate_reference_seconds(s.cfg, dbl)), " s)");
    }
    LS_REQUIRE(est <= opt.max_seconds, "the reference step of this model is estimated at ",
               static_cast<int64_t>(est), " s (", static_cast<int64_t>(est / 60), " min) in ",
               reference_name(s.cfg, opt), ", above --verify.max_seconds=", opt.max_seconds,
               "; use a smaller [model]/[train] batch_size", faster,
               ", or --verify.force to run it anyway");
  }
  CpuBackend backend({tc.threads, tc.isa, tc.fast_gemm});

  const StepSetup u = step_setup(s);
  StepReport report;
  report.mode = std::string(mode_name(tc.mode));
  report.step = s.step;

  std::vector<std::string> order;
  auto t0 = Clock::now();
  auto got = run_trainer(s, u, backend, order);
  report.trainer_seconds = seconds_since(t0);
  report.grad_norm = got.at("grad_norm").data[0];
  report.grad_clip = static_cast<float>(tc.grad_clip);

  if (!opt.perturb.empty()) {
    auto it = got.find(opt.perturb);
    LS_REQUIRE(it != got.end() && !it->second.data.empty(), "--verify.perturb: no tensor named '",
               opt.perturb, "' (names as in the report, e.g. layer/0/attn/qkv, grad/wte)");
    float& x = it->second.data[0];
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits ^= 1u << opt.perturb_bit;
    std::memcpy(&x, &bits, sizeof bits);
  }

  // Canonical: the emulation runs the whole step on its own (end-to-end bitwise). Fast: the
  // Bounded reference is re-anchored on the trainer's tensors at every hook point, so each bound
  // covers the ops since the previous tensor (carried through the whole model, first-order
  // worst-case bounds grow ~100x per layer and are vacuous after two layers).
  std::map<std::string, RefTensor> want;
  t0 = Clock::now();
  if (canonical) {
    report.reference = "CanonicalF32";
    want = run_reference<reference::CanonicalF32>(s, u, got, false);
  } else if (opt.reference_type == ReferenceType::kDouble) {
    reference::BoundedFormat f = reference::bounded_format();
    f.u = reference::kBoundedDoubleU;
    f.lambda = opt.lambda;
    reference::ScopedBoundedFormat own_roundings(f);
    report.reference = "Bounded<double, u = 2^-24 + 2^-51>, op-local" + probabilistic(s, opt.lambda, f.u);
    want = run_reference<reference::Bounded<double>>(s, u, got, true);
  } else {
    reference::ScopedMpfrBits bits(opt.reference_bits);
    reference::BoundedFormat f = reference::bounded_format();
    f.lambda = opt.lambda;
    reference::ScopedBoundedFormat probabilistic_bounds(f);
    report.reference = "Bounded<mpfr " + std::to_string(reference::mpfr_bits()) + " bits>, op-local" +
                       probabilistic(s, opt.lambda, f.u);
    want = run_reference<reference::MpfrBounded>(s, u, got, true);
  }
  report.reference_seconds = seconds_since(t0);

  // Rows: the trainer's hook order with the mean loss after the per-token losses, then the
  // gradient norm, parameter gradients, updated parameters and moments in layout order.
  std::vector<std::string> rows;
  for (const auto& name : order) {
    const int64_t layer = layer_of(name);
    if (layer >= 0 && !opt.layers.empty() &&
        std::find(opt.layers.begin(), opt.layers.end(), layer) == opt.layers.end()) {
      continue;
    }
    rows.push_back(name);
    if (name == "losses") rows.push_back("loss");
  }
  for (const char* h : {"hyper/lr", "hyper/bias_correction1", "hyper/bias_correction2"}) rows.push_back(h);
  rows.push_back("grad_norm");
  const auto layout = reference::reference_param_layout(s.model);
  for (const auto& p : layout) rows.push_back("grad/" + p.name);
  for (const auto& p : layout) {
    rows.push_back("param/" + p.name);
    rows.push_back("optim/m/" + p.name);
    rows.push_back("optim/v/" + p.name);
  }

  for (const auto& name : rows) {
    const Observed& g = got.at(name);
    const auto it = want.find(name);
    LS_CHECK(it != want.end(), "the reference produced no tensor ", name);
    const RefTensor& w = it->second;
    const auto n = static_cast<int64_t>(g.data.size());
    TensorRow row;
    row.name = name;
    row.shape = g.shape;
    if (canonical) {
      LS_CHECK(static_cast<int64_t>(w.f32.size()) == n, name, ": reference has ", w.f32.size(),
               " elements, the trainer ", n);
      row.check = CheckKind::kBitwise;
      row.cmp = compare_exact(g.data.data(), w.f32.data(), n);
    } else {
      LS_CHECK(static_cast<int64_t>(w.value.size()) == n, name, ": reference has ",
               w.value.size(), " elements, the trainer ", n);
      row.check = CheckKind::kBound;
      row.cmp = compare_within(g.data.data(), w.value.data(), w.bound.data(), n);
    }
    report.rows.push_back(std::move(row));
  }
  return report;
}

}  // namespace lockstep::verify
