// Dataset builders behind `lockstep data build` and `lockstep data synth`.
//
// build_byte_dataset: text files -> DIR/train.bin, DIR/val.bin (token files, byte tokenizer) and
// DIR/data.json. Inputs are files or directories; a directory contributes its regular files ending
// in ".txt" (not recursive), sorted by name (byte order) so the result does not depend on the file
// system. Each file is one document. Split rule, per document of n bytes: the last
// floor(n * val_fraction) bytes go to val, the first n - floor(n * val_fraction) to train; within
// each split, the documents' parts are joined in input order by the end-of-text token 256, so a
// single document yields no separator at all. Every output is written atomically.
//
// synth_markov_corpus: a Markov chain from datasets/markov.hpp -> DIR/corpus.txt (the sampled
// characters, no newline, so every byte is a chain symbol and the entropy rate of the tokens is
// exactly the chain's) and DIR/source.json: the entropy rate h, H(pi), and the Bayes-optimal mean
// loss over a window of T tokens, (H(pi) + (T - k) h) / T, for T in {64, ..., 1024} — the loss a
// perfect model reaches on windows that start without context, above h by (H(pi) - k h) / T.
//
// Not a tokenizer trainer and not a downloader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "datasets/markov.hpp"

namespace lockstep::data {

struct BuildSpec {
  std::vector<std::string> inputs;  // files or directories of .txt files
  std::string out_dir;
  double val_fraction = 0.1;        // in (0, 1)
};

struct BuiltFile {
  std::string path;
  int64_t tokens = 0;
  int64_t bytes = 0;
};

struct BuildResult {
  std::vector<std::string> sources;  // the documents, in order
  BuiltFile train, val, data_json;
};

// The documents named by `inputs`, in order: files as given, directories expanded (sorted .txt
// files). Throws ConfigError for a missing path or a directory without .txt files.
std::vector<std::string> list_sources(const std::vector<std::string>& inputs);

// Creates out_dir if needed. Throws ConfigError for bad arguments, DataError for I/O failures.
BuildResult build_byte_dataset(const BuildSpec& spec);

struct SynthResult {
  std::string corpus_path;
  std::string source_json_path;
  double entropy_rate = 0;           // nats/token
  double context_entropy = 0;        // H(pi), nats
  int order = 0;
  int attempts = 1;
  uint64_t chain_seed = 0;
};

// `tokens` characters sampled with seed splitmix64_mix(spec.seed) from MarkovChain::generate(spec).
SynthResult synth_markov_corpus(const std::string& out_dir, const datasets::MarkovSpec& spec, int64_t tokens);

}  // namespace lockstep::data
