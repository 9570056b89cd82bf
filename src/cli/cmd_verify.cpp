// `lockstep verify step --config FILE --checkpoint DIR [options]`: runs the step after a
// checkpoint in the trainer and in the reference and reports every tensor (verify/step.hpp).
// Exit status: 0 when every tensor passes, 1 on any violation, 2 on bad input.
// Not here: periodic verification during training, diff and bisect.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/core/parse_number.hpp"
#include "src/train/config.hpp"
#include "verify/step.hpp"

namespace lockstep::cli {
namespace {

constexpr const char* kVerifyUsage =
    "usage: lockstep verify step --config FILE --checkpoint DIR [options] [--section.key=value ...]\n"
    "  runs the step after checkpoint DIR (a step_* directory or a root: its newest) in the\n"
    "  trainer and in the reference; one row per tensor, a summary naming the worst tensor;\n"
    "  exit 1 on any violation. canonical mode: bitwise vs the CanonicalF32 emulation;\n"
    "  fast mode: within the Bounded<mpfr> (or <double>) bound (tightness = error/bound)\n"
    "options:\n"
    "  --reference.type=T        fast mode's Bounded reference: mpfr (default) or double (its own\n"
    "                            roundings counted in the bound; a few hundred times faster)\n"
    "  --reference.bits=N        MPFR precision of the Bounded reference (default 256)\n"
    "  --reference.lambda=L      fast mode: probabilistic bounds (Higham & Mary) with lambda L > 0 in\n"
    "                            place of the worst case; the report gives their probability\n"
    "  --verify.layers=0,2       activation rows of these layers only\n"
    "  --verify.max_seconds=S    refuse when the estimated reference time exceeds S (default 900)\n"
    "  --verify.force            run whatever the estimate\n"
    "  --verify.perturb=TENSOR[:BIT]  test only: flip bit BIT (default 0, the lowest) of element 0\n"
    "                            of the trainer's TENSOR before comparing\n"
    "  --json FILE               also write the report as JSON\n";

int64_t parse_int(const std::string& key, const std::string& text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  LS_REQUIRE(ec == std::errc() && end == text.data() + text.size(), "--", key,
             ": expected an integer, got '", text, "'");
  return v;
}

double parse_seconds(const std::string& key, const std::string& text) {
  const std::optional<double> v = parse_number(text);
  LS_REQUIRE(v && *v > 0, "--", key, ": expected a positive number, got '", text, "'");
  return *v;
}

}  // namespace

int cmd_verify(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kVerifyUsage;
    return 0;
  }
  LS_REQUIRE(!args.positionals().empty() && args.positionals()[0] == "step",
             "lockstep verify: expected the subcommand 'step' (see lockstep verify --help)");
  LS_REQUIRE(args.positionals().size() == 1, "lockstep verify step: unexpected argument '",
             args.positionals()[1], "'");
  const auto config = args.take("config");
  LS_REQUIRE(config.has_value(), "lockstep verify step: --config FILE is required");
  const auto checkpoint = args.take("checkpoint");
  LS_REQUIRE(checkpoint.has_value(), "lockstep verify step: --checkpoint DIR is required");
  const auto json_path = args.take("json");

  verify::StepOptions opt;
  if (auto type = args.take("reference.type")) {
    LS_REQUIRE(*type == "mpfr" || *type == "double", "--reference.type: expected mpfr or double, got '",
               *type, "'");
    opt.reference_type = *type == "double" ? verify::ReferenceType::kDouble : verify::ReferenceType::kMpfr;
  }
  if (auto lambda = args.take("reference.lambda")) {
    char* end = nullptr;
    opt.lambda = std::strtod(lambda->c_str(), &end);
    LS_REQUIRE(end != lambda->c_str() && *end == '\0' && opt.lambda > 0 && std::isfinite(opt.lambda),
               "--reference.lambda: expected a positive number, got '", *lambda, "'");
  }
  if (auto bits = args.take("reference.bits")) {
    const int64_t b = parse_int("reference.bits", *bits);
    LS_REQUIRE(b >= 64 && b <= 4096, "--reference.bits: expected 64..4096 bits, got ", b);
    opt.reference_bits = static_cast<unsigned>(b);
  }
  if (auto layers = args.take("verify.layers")) {
    size_t start = 0;
    while (start <= layers->size()) {
      const size_t comma = std::min(layers->find(',', start), layers->size());
      opt.layers.push_back(parse_int("verify.layers", layers->substr(start, comma - start)));
      start = comma + 1;
    }
  }
  if (auto s = args.take("verify.max_seconds")) opt.max_seconds = parse_seconds("verify.max_seconds", *s);
  opt.force = args.take_flag("verify.force");
  opt.perturb = args.take_or("verify.perturb", "");
  if (const size_t colon = opt.perturb.rfind(':'); colon != std::string::npos) {
    const int64_t bit = parse_int("verify.perturb", opt.perturb.substr(colon + 1));
    LS_REQUIRE(bit >= 0 && bit < 31, "--verify.perturb: bit ", bit, " must be in [0, 31)");
    opt.perturb_bit = static_cast<int>(bit);
    opt.perturb.resize(colon);
  }
  const auto overrides = args.take_dotted();
  args.finish("verify step");

  const RunConfig cfg = load_run_config(*config, overrides);
  for (int64_t l : opt.layers) {
    LS_REQUIRE(l >= 0 && l < cfg.model.n_layers, "--verify.layers: layer ", l,
               " does not exist (the model has ", cfg.model.n_layers, " layers)");
  }
  const verify::StepState state = verify::load_step_state(cfg, *checkpoint);
  const verify::StepReport report = verify::verify_step(state, opt);
  verify::print_report(report, std::cout);
  if (json_path) {
    std::ofstream out(*json_path);
    LS_REQUIRE(out.good(), "--json: cannot write ", *json_path);
    out << verify::report_json(report).dump(1) << "\n";
    out.close();
    if (!out) throw DataError(str_cat(*json_path, ": write failed"));
  }
  return report.ok() ? 0 : 1;
}

}  // namespace lockstep::cli
