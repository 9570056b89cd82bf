// Op-local bounds of a dumped step (op_bounds.hpp): the Bounded<double> whole-step reference,
// re-anchored on the side's dumped tensors, from the side's checkpoint before the step.
// The setup mirrors verify/step.cpp (which runs the trainer itself; here the trainer's tensors come
// from a dump).
#include "verify/op_bounds.hpp"

#include <cmath>
#include <limits>

#include "reference/bounded.hpp"
#include "reference/gpt.hpp"
#include "src/ckpt/checkpoint.hpp"
#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/train/config.hpp"
#include "verify/step.hpp"

namespace lockstep::verify {

namespace {

using Real = reference::Bounded<double>;

}  // namespace

RunConfig dump_run_config(const Dump& dump) {
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& [section, keys] : dump.manifest.at("config").items()) {
    for (const auto& [key, value] : keys.items()) {
      overrides.emplace_back(section + "." + key, value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  RunConfig cfg = load_run_config("/dev/null", overrides);
  cfg.source = dump.dir + "/manifest.json";
  return cfg;
}

namespace {

void record(const Real* x, int64_t n, OpLocalBound& out) {
  out.value.resize(static_cast<size_t>(n));
  out.bound.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out.value[i] = x[i].value;
    // Rounded up, so that the bound stays rigorous after the conversion to double.
    out.bound[i] = std::nextafter(x[i].err, std::numeric_limits<double>::infinity());
  }
}

}  // namespace

std::map<std::string, OpLocalBound> op_local_bounds(const Dump& dump, int64_t step, const std::string& ckpt_root) {
  const RunConfig cfg = dump_run_config(dump);
  const std::string step_dir = ckpt_root + "/" + ckpt::step_dir_name(step);
  const std::string dir = durable_io::exists(step_dir + "/" + ckpt::kManifestFile) ? step_dir : ckpt_root;
  StepState s;
  if (step == 0 && !durable_io::exists(dir + "/" + ckpt::kManifestFile)) {
    s = initial_step_state(cfg);  // a function of the config
  } else {
    LS_REQUIRE(!ckpt_root.empty() && durable_io::exists(dir + "/" + ckpt::kManifestFile), dump.dir,
               ": --bounds needs the checkpoint written before step ", step, " (--ckpt-a/--ckpt-b DIR holding ",
               ckpt::step_dir_name(step), ", or that checkpoint itself", ckpt_root.empty() ? "" : "; not found in " + ckpt_root,
               "): it holds the parameters, AdamW moments and data position the step started from");
    s = load_step_state(cfg, dir);
  }
  LS_REQUIRE(s.step == step, dir, ": a checkpoint of step ", s.step, ", but the dump's step is ", step,
             " (--bounds needs the state the dumped step started from)");

  // What the dump holds for this step, by hook name.
  const std::string prefix = "step/" + std::to_string(step) + "/";
  std::map<std::string, std::vector<float>> dumped;
  for (const auto& e : dump.entries) {
    if (e.step == step) dumped[e.name.substr(prefix.size())] = load_entry(dump, e);
  }

  const StepSetup setup = step_setup(s);

  // The reference's own double roundings are covered by counting them into u (kBoundedDoubleU).
  reference::BoundedFormat own = reference::bounded_format();
  own.u = reference::kBoundedDoubleU;
  reference::ScopedBoundedFormat own_roundings(own);
  reference::GptReference<Real> ref(s.model, setup.B, s.cfg.train.precision_recipe());
  ref.fp8_scales = fp8_scales(s);
  ref.selection_biases = selection_biases(s);
  for (size_t i = 0; i < s.params.size(); ++i) {
    ref.params[i] = Real(s.params[i]);
    ref.m[i] = Real(s.m[i]);
    ref.v[i] = Real(s.v[i]);
  }
  std::map<std::string, OpLocalBound> out;
  // Records the reference's tensor, then continues from the side's dumped one where there is one.
  auto anchor = [&](const std::string& key, Real* data, int64_t n) {
    record(data, n, out[key]);
    const auto it = dumped.find(key);
    if (it == dumped.end()) return;
    LS_REQUIRE(static_cast<int64_t>(it->second.size()) == n, dump.dir, ": ", prefix, key, " has ",
               it->second.size(), " elements, the model of the dump's config ", n);
    for (int64_t i = 0; i < n; ++i) data[i] = Real(it->second[i]);
  };
  const Real loss = ref.forward_backward(
      s.inputs.data(), s.targets.data(), setup.loss_segments, setup.dloss,
      [&](std::string_view name, Real* data, const std::vector<int64_t>& shape) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        anchor(std::string(name), data, n);
      });
  record(&loss, 1, out["loss"]);
  for (const auto& p : ref.layout()) anchor("grad/param/" + p.name, ref.grads().data() + p.offset, p.numel);
  ref.clip_and_update(setup.hyper);
  for (const auto& p : ref.layout()) record(ref.params.data() + p.offset, p.numel, out["param/" + p.name]);
  return out;
}

}  // namespace lockstep::verify
