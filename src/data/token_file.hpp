// Token files in llm.c's format: a header of 256 little-endian int32 — [0] magic 20240520,
// [1] version 1, [2] token count, the rest zero — followed by the tokens as little-endian uint16.
// TokenFile maps a file read-only and validates it; TokenFileWriter and write_token_file produce
// one atomically (temporary name, fsync, rename).
// Not a dataset: splitting, sampling and batching live in build.hpp and sampler.hpp. Not portable
// to big-endian hosts (refused at compile time): tokens are used in place from the mapping.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>

#include "src/core/durable_io.hpp"

namespace lockstep::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and are read in place");

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;    // 1024
inline constexpr int64_t kTokenFileMaxTokens = INT32_MAX;                      // header[2] is int32

// Bytes of a valid file holding `tokens` tokens.
constexpr int64_t token_file_bytes(int64_t tokens) { return kTokenFileHeaderBytes + 2 * tokens; }

// A validated, read-only, memory-mapped token file. Construction throws DataError, naming the path,
// the field and the expectation, when the file is missing or unreadable, shorter than the header,
// has a bad magic (with the command that regenerates it), an unsupported version, or a token count
// that disagrees with the file size. Move-only; the mapping lives as long as the object.
class TokenFile {
 public:
  explicit TokenFile(std::string path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return num_tokens_; }                      // tokens, from header[2]
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(num_tokens_)}; }
  uint16_t operator[](int64_t i) const { return tokens_[i]; }

  // Throws DataError naming the first position whose token is >= vocab_size. Reads every token
  // (scan_tokens).
  void check_vocab(int32_t vocab_size) const;
  // The largest token (-1 for an empty file). Reads every token (scan_tokens).
  int32_t max_token() const;

 private:
  void release();
  // Calls visit(first, end) over [0, size()) in consecutive runs of tokens, giving each run's
  // pages back to the file after its visit: a scan of the whole file would otherwise leave all of
  // it resident in this process, counted in its memory, where training reads a few windows a step.
  template <class Visit>
  void scan_tokens(const Visit& visit) const;

  std::string path_;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  int64_t num_tokens_ = 0;
  const uint16_t* tokens_ = nullptr;
};

// Streams tokens into a new token file: the header is written last, then the file is committed.
// If commit() is never called (an exception on the way), nothing appears under `path`.
class TokenFileWriter {
 public:
  explicit TokenFileWriter(std::string path);

  void append(std::span<const uint16_t> tokens);
  void append(uint16_t token) { append(std::span<const uint16_t>(&token, 1)); }
  int64_t size() const { return num_tokens_; }
  // Writes the header, fsyncs and renames. Throws DataError past kTokenFileMaxTokens tokens.
  void commit();

 private:
  durable_io::AtomicFile file_;
  int64_t num_tokens_ = 0;
};

// The whole of `tokens` as a token file at `path`.
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace lockstep::data
