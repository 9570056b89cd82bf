// `lockstep data`: build token datasets from text, synthesise a Markov corpus with a known
// entropy rate, and inspect token files. Argument parsing and printing only; the work is in
// src/data/build.hpp and datasets/markov.hpp.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "src/cli/commands.hpp"
#include "src/core/check.hpp"
#include "src/data/build.hpp"
#include "src/data/token_file.hpp"

namespace lockstep::cli {

namespace {

constexpr const char* kDataUsage = R"(usage:
  lockstep data build --input PATH [PATH ...] --out DIR [--val-fraction 0.1]
      PATH: a text file, or a directory whose .txt files are taken sorted by name; one document per
      file. Writes DIR/train.bin, DIR/val.bin (llm.c token files, byte tokenizer: vocab 257, token
      256 between documents) and DIR/data.json. Split: the last floor(n * val-fraction) bytes of
      each document go to val.
  lockstep data synth --out DIR [--order 2] [--alphabet 16] [--branch 4] [--tokens 2000000] [--seed 1234]
      Samples a random sparse Markov chain of the given order over `alphabet` letters, `branch`
      possible next letters per context; writes DIR/corpus.txt and DIR/source.json and prints the
      exact entropy rate in nats/token. Then run `lockstep data build --input DIR/corpus.txt --out DIR`.
  lockstep data inspect FILE [--vocab-size N]
      Validates a token file (header, size, and tokens < N if given) and prints its header.
)";

template <class Int>
Int parse_int(const std::string& option, const std::string& text, Int lo, Int hi) {
  Int value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  LS_REQUIRE(ec == std::errc() && end == text.data() + text.size(), "option --", option,
             " expects an integer, got '", text, "'");
  LS_REQUIRE(value >= lo && value <= hi, "option --", option, " must be in [", lo, ", ", hi, "], got ", value);
  return value;
}

double parse_double(const std::string& option, const std::string& text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  LS_REQUIRE(ec == std::errc() && end == text.data() + text.size(), "option --", option,
             " expects a number, got '", text, "'");
  return value;
}

std::string require_option(Args& args, const std::string& verb, const std::string& option) {
  auto value = args.take(option);
  LS_REQUIRE(value && *value != "true", "lockstep data ", verb, ": --", option, " is required (see `lockstep data --help`)");
  return *value;
}

void print_file(const data::BuiltFile& f, const char* what) {
  std::cout << "wrote " << f.path << ": " << f.tokens << " " << what << " (" << f.bytes << " bytes)\n";
}

int data_build(Args& args) {
  data::BuildSpec spec;
  // Several inputs: `--input A B C`; Args keeps one value per option, the rest arrive as positionals.
  spec.inputs.push_back(require_option(args, "build", "input"));
  for (size_t i = 1; i < args.positionals().size(); ++i) spec.inputs.push_back(args.positionals()[i]);
  spec.out_dir = require_option(args, "build", "out");
  if (auto f = args.take("val-fraction")) spec.val_fraction = parse_double("val-fraction", *f);
  args.finish("data build");
  const data::BuildResult r = data::build_byte_dataset(spec);
  print_file(r.train, "tokens");
  print_file(r.val, "tokens");
  std::cout << "wrote " << r.data_json.path << ": byte tokenizer, vocab_size 257, " << r.sources.size()
            << " source file(s), val_fraction " << spec.val_fraction << "\n";
  return 0;
}

int data_synth(Args& args) {
  LS_REQUIRE(args.positionals().size() == 1, "lockstep data synth: unexpected argument '", args.positionals()[1],
             "'");
  datasets::MarkovSpec spec;
  const std::string out = require_option(args, "synth", "out");
  if (auto v = args.take("order")) spec.order = parse_int<int>("order", *v, 1, 22);
  if (auto v = args.take("alphabet")) spec.alphabet = parse_int<int>("alphabet", *v, 2, datasets::kMarkovMaxAlphabet);
  if (auto v = args.take("branch")) spec.branch = parse_int<int>("branch", *v, 1, datasets::kMarkovMaxAlphabet);
  if (auto v = args.take("seed")) spec.seed = parse_int<uint64_t>("seed", *v, 0, UINT64_MAX);
  int64_t tokens = 2000000;
  if (auto v = args.take("tokens")) tokens = parse_int<int64_t>("tokens", *v, 1, data::kTokenFileMaxTokens);
  args.finish("data synth");
  const data::SynthResult r = data::synth_markov_corpus(out, spec, tokens);
  std::printf("entropy rate: %.9f nats/token (order %d, alphabet %d, branch %d, seed %llu; chain seed %llu, "
              "%d attempt(s))\n",
              r.entropy_rate, spec.order, spec.alphabet, spec.branch, static_cast<unsigned long long>(spec.seed),
              static_cast<unsigned long long>(r.chain_seed), r.attempts);
  const auto window_loss = [&](int T) { return (r.context_entropy + (T - r.order) * r.entropy_rate) / T; };
  std::printf("Bayes-optimal mean loss over a window of T tokens: (%.6f + (T - %d) * %.6f) / T = %.6f at T=64, "
              "%.6f at T=256, %.6f at T=1024\n",
              r.context_entropy, r.order, r.entropy_rate, window_loss(64), window_loss(256), window_loss(1024));
  std::cout << "wrote " << r.corpus_path << ": " << tokens << " characters\n";
  std::cout << "wrote " << r.source_json_path << "\n";
  return 0;
}

int data_inspect(Args& args) {
  LS_REQUIRE(args.positionals().size() == 2, "lockstep data inspect: expected one FILE (see `lockstep data --help`)");
  std::optional<int32_t> vocab_size;
  if (auto v = args.take("vocab-size")) vocab_size = parse_int<int32_t>("vocab-size", *v, 1, 65536);
  args.finish("data inspect");
  const data::TokenFile file(args.positionals()[1]);
  if (vocab_size) file.check_vocab(*vocab_size);
  std::cout << file.path() << ": magic " << data::kTokenFileMagic << " version " << data::kTokenFileVersion
            << " tokens " << file.size() << " bytes " << data::token_file_bytes(file.size()) << " max_token "
            << file.max_token();
  if (vocab_size) std::cout << " (all < vocab_size " << *vocab_size << ")";
  std::cout << "\n";
  return 0;
}

}  // namespace

int cmd_data(Args& args) {
  if (args.take_flag("help")) {
    std::cout << kDataUsage;
    return 0;
  }
  LS_REQUIRE(!args.positionals().empty(), "lockstep data: expected a verb: build, synth or inspect (see `lockstep data --help`)");
  const std::string& verb = args.positionals()[0];
  if (verb == "build") return data_build(args);
  if (verb == "synth") return data_synth(args);
  if (verb == "inspect") return data_inspect(args);
  throw ConfigError(str_cat("lockstep data: unknown verb '", verb, "' (expected build, synth or inspect)"));
}

}  // namespace lockstep::cli
