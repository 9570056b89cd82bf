// Dataset builders: the documented split rule byte for byte, source ordering, data.json, argument
// errors, and the synthetic Markov corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/markov.hpp"
#include "src/core/check.hpp"
#include "src/data/build.hpp"
#include "src/data/token_file.hpp"
#include "src/data/tokenizer.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/temp_dir.hpp"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using test::config_error;
using test::read_text;
using test::TempDir;
using test::write_text;

std::vector<uint16_t> tokens_of(const std::string& path) {
  TokenFile file(path);
  return {file.tokens().begin(), file.tokens().end()};
}

TEST(BuildByteDataset, SplitsEachDocumentsTailIntoVal) {
  TempDir dir;
  write_text(dir.file("in/b.txt"), "abcd");        // n 4: floor(1.2) = 1 byte to val
  write_text(dir.file("in/a.txt"), "0123456789");  // n 10: floor(3.0) = 3 bytes to val
  write_text(dir.file("in/notes.md"), "ignored");
  const BuildResult r = build_byte_dataset({{dir.file("in")}, dir.file("out"), 0.3});
  EXPECT_EQ(r.sources, (std::vector<std::string>{dir.file("in/a.txt"), dir.file("in/b.txt")}));
  const std::vector<std::string> train_docs = {"0123456", "abc"}, val_docs = {"789", "d"};
  EXPECT_EQ(tokens_of(dir.file("out/train.bin")), byte_encode_documents(train_docs));
  EXPECT_EQ(tokens_of(dir.file("out/val.bin")), byte_encode_documents(val_docs));
  EXPECT_EQ(r.train.tokens, 11);
  EXPECT_EQ(r.val.tokens, 5);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(r.train.path)), r.train.bytes);

  const auto info = nlohmann::json::parse(read_text(dir.file("out/data.json")));
  EXPECT_EQ(info["tokenizer"], "byte");
  EXPECT_EQ(info["vocab_size"], 257);
  EXPECT_EQ(info["eot_token"], 256);
  EXPECT_EQ(info["train"]["tokens"], 11);
  EXPECT_EQ(info["val"]["tokens"], 5);
  EXPECT_EQ(info["split"]["val_fraction"], 0.3);
  ASSERT_EQ(info["sources"].size(), 2u);
  EXPECT_EQ(info["sources"][1]["path"], dir.file("in/b.txt"));
  EXPECT_EQ(info["sources"][1]["val_tokens"], 1);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.file("out")), fs::directory_iterator()), 3);
}

TEST(BuildByteDataset, SingleDocumentHasNoSeparator) {
  TempDir dir;
  write_text(dir.file("doc.txt"), std::string(100, 'x'));
  const BuildResult r = build_byte_dataset({{dir.file("doc.txt")}, dir.file("out"), 0.1});
  EXPECT_EQ(tokens_of(r.train.path), std::vector<uint16_t>(90, 'x'));
  EXPECT_EQ(tokens_of(r.val.path), std::vector<uint16_t>(10, 'x'));
}

TEST(BuildByteDataset, RejectsBadArguments) {
  TempDir dir;
  EXPECT_TRUE(std::regex_match(config_error([&] { build_byte_dataset({{dir.file("nope.txt")}, dir.file("o"), 0.1}); }),
                               std::regex("input .*nope.txt: no such file or directory")));
  fs::create_directories(dir.file("empty"));
  EXPECT_TRUE(std::regex_match(config_error([&] { build_byte_dataset({{dir.file("empty")}, dir.file("o"), 0.1}); }),
                               std::regex("input .*empty: directory holds no .txt file")));
  write_text(dir.file("a.txt"), "abc");
  EXPECT_TRUE(std::regex_match(config_error([&] { build_byte_dataset({{dir.file("a.txt")}, dir.file("o"), 1.0}); }),
                               std::regex("val_fraction must be in \\(0, 1\\), got 1")));
  EXPECT_TRUE(std::regex_match(config_error([&] { build_byte_dataset({{}, dir.file("o"), 0.1}); }),
                               std::regex("no input given: .*")));
}

TEST(SynthMarkovCorpus, WritesCorpusAndSourceInfo) {
  TempDir dir;
  const datasets::MarkovSpec spec{2, 16, 4, 1234};
  const SynthResult r = synth_markov_corpus(dir.file("synth"), spec, 5000);
  const std::string corpus = read_text(r.corpus_path);
  ASSERT_EQ(corpus.size(), 5000u);
  EXPECT_EQ(corpus.find_first_not_of("abcdefghijklmnop"), std::string::npos);
  const auto info = nlohmann::json::parse(read_text(r.source_json_path));
  const datasets::MarkovChain chain = datasets::MarkovChain::generate(spec);
  EXPECT_EQ(info["entropy_rate_nats"].get<double>(), chain.entropy_rate());
  EXPECT_EQ(info["context_entropy_nats"].get<double>(), chain.context_entropy());
  EXPECT_EQ(info["order"], 2);
  EXPECT_EQ(info["alphabet"], 16);
  EXPECT_EQ(info["branch"], 4);
  EXPECT_EQ(info["seed"], 1234);
  EXPECT_EQ(info["tokens"], 5000);
  // Deterministic: the same corpus again, and the byte dataset built on it has no separator.
  TempDir again;
  EXPECT_EQ(read_text(synth_markov_corpus(again.file("synth"), spec, 5000).corpus_path), corpus);
  const BuildResult built = build_byte_dataset({{r.corpus_path}, dir.file("synth"), 0.1});
  EXPECT_EQ(built.train.tokens + built.val.tokens, 5000);
  TokenFile train(built.train.path);
  EXPECT_LT(train.max_token(), kByteEot);
}

}  // namespace
}  // namespace lockstep::data
