// Dataset builders (see build.hpp).
#include "src/data/build.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/durable_io.hpp"
#include "src/core/splitmix64.hpp"
#include "src/data/token_file.hpp"
#include "src/data/tokenizer.hpp"

namespace lockstep::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSplitRule =
    "per document of n bytes: the last floor(n * val_fraction) bytes go to val, the rest to train; "
    "each split joins its parts in source order with the end-of-text token 256";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(str_cat(path, ": cannot open for reading"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(str_cat(path, ": read failed"));
  return text;
}

void make_directory(const std::string& dir) {
  LS_REQUIRE(!dir.empty(), "output directory must not be empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LS_REQUIRE(!ec && fs::is_directory(dir), "cannot create output directory ", dir, ": ", ec.message());
}

std::string json_text(const nlohmann::json& j) { return j.dump(2) + "\n"; }

}  // namespace

std::vector<std::string> list_sources(const std::vector<std::string>& inputs) {
  LS_REQUIRE(!inputs.empty(), "no input given: pass --input PATH (a text file or a directory of .txt files)");
  std::vector<std::string> sources;
  for (const auto& input : inputs) {
    std::error_code ec;
    const auto status = fs::status(input, ec);
    LS_REQUIRE(!ec && fs::exists(status), "input ", input, ": no such file or directory");
    if (fs::is_directory(status)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input)) {
        if (entry.is_regular_file() && entry.path().extension() == ".txt") found.push_back(entry.path().string());
      }
      LS_REQUIRE(!found.empty(), "input ", input, ": directory holds no .txt file");
      std::sort(found.begin(), found.end());
      sources.insert(sources.end(), found.begin(), found.end());
    } else {
      LS_REQUIRE(fs::is_regular_file(status), "input ", input, ": not a regular file or directory");
      sources.push_back(input);
    }
  }
  return sources;
}

BuildResult build_byte_dataset(const BuildSpec& spec) {
  LS_REQUIRE(spec.val_fraction > 0 && spec.val_fraction < 1, "val_fraction must be in (0, 1), got ",
             spec.val_fraction);
  BuildResult result;
  result.sources = list_sources(spec.inputs);
  make_directory(spec.out_dir);
  result.train.path = spec.out_dir + "/train.bin";
  result.val.path = spec.out_dir + "/val.bin";
  result.data_json.path = spec.out_dir + "/data.json";

  TokenFileWriter train(result.train.path), val(result.val.path);
  const auto eot = static_cast<uint16_t>(kByteEot);
  nlohmann::json sources = nlohmann::json::array();
  for (size_t d = 0; d < result.sources.size(); ++d) {
    const std::string text = read_file(result.sources[d]);
    const auto n = static_cast<int64_t>(text.size());
    // floor(n * f) in double: exact for n < 2^53 up to the one rounding of the product.
    const auto n_val = static_cast<int64_t>(std::floor(static_cast<double>(n) * spec.val_fraction));
    const std::vector<uint16_t> tokens = byte_encode(text);
    if (d > 0) {
      train.append(eot);
      val.append(eot);
    }
    train.append(std::span<const uint16_t>(tokens).first(static_cast<size_t>(n - n_val)));
    val.append(std::span<const uint16_t>(tokens).last(static_cast<size_t>(n_val)));
    sources.push_back({{"path", result.sources[d]}, {"bytes", n}, {"train_tokens", n - n_val},
                       {"val_tokens", n_val}});
  }
  result.train.tokens = train.size();
  result.val.tokens = val.size();
  result.train.bytes = token_file_bytes(result.train.tokens);
  result.val.bytes = token_file_bytes(result.val.tokens);
  train.commit();
  val.commit();

  const nlohmann::json info = {
      {"format", "lockstep-data"},
      {"version", 1},
      {"tokenizer", "byte"},
      {"vocab_size", kByteVocabSize},
      {"eot_token", kByteEot},
      {"train", {{"file", "train.bin"}, {"tokens", result.train.tokens}}},
      {"val", {{"file", "val.bin"}, {"tokens", result.val.tokens}}},
      {"split", {{"val_fraction", spec.val_fraction}, {"rule", kSplitRule}}},
      {"sources", sources},
  };
  const std::string text = json_text(info);
  durable_io::write_file_atomic(result.data_json.path, text);
  result.data_json.bytes = static_cast<int64_t>(text.size());
  return result;
}

SynthResult synth_markov_corpus(const std::string& out_dir, const datasets::MarkovSpec& spec, int64_t tokens) {
  LS_REQUIRE(tokens >= 1, "tokens must be >= 1, got ", tokens);
  const datasets::MarkovChain chain = datasets::MarkovChain::generate(spec);
  make_directory(out_dir);
  SynthResult result;
  result.corpus_path = out_dir + "/corpus.txt";
  result.source_json_path = out_dir + "/source.json";
  result.entropy_rate = chain.entropy_rate();
  result.context_entropy = chain.context_entropy();
  result.order = chain.order();
  result.attempts = chain.attempts();
  result.chain_seed = chain.chain_seed();

  const uint64_t sample_seed = splitmix64_mix(spec.seed);
  nlohmann::json window_losses = nlohmann::json::object();
  for (int64_t T : {64, 128, 256, 512, 1024}) window_losses[std::to_string(T)] = chain.optimal_window_loss(T);
  durable_io::write_file_atomic(result.corpus_path, chain.sample(tokens, sample_seed));
  const nlohmann::json info = {
      {"source", "markov"},
      {"entropy_rate_nats", chain.entropy_rate()},
      {"context_entropy_nats", chain.context_entropy()},
      {"optimal_window_loss_rule",
       "(context_entropy_nats + (T - order) * entropy_rate_nats) / T for a window of T >= order tokens"},
      {"optimal_window_loss_nats", window_losses},
      {"order", spec.order},
      {"alphabet", spec.alphabet},
      {"branch", spec.branch},
      {"seed", spec.seed},
      {"chain_seed", chain.chain_seed()},
      {"attempts", chain.attempts()},
      {"sample_seed", sample_seed},
      {"tokens", tokens},
      {"power_iterations", chain.power_iterations()},
  };
  durable_io::write_file_atomic(result.source_json_path, json_text(info));
  return result;
}

}  // namespace lockstep::data
