// Token files: write/read round trip, atomic writes, and every rejection of a bad file with a
// message naming the path, the field and the expectation.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/data/token_file.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/temp_dir.hpp"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using test::matches;
using test::read_bytes;
using test::TempDir;
using test::write_bytes;

// Overwrites header[index] of a token file with `value` (the header is little-endian int32).
void patch_header(const std::string& path, int index, int32_t value) {
  std::vector<char> bytes = read_bytes(path);
  std::memcpy(bytes.data() + 4 * index, &value, 4);
  write_bytes(path, bytes);
}

// The DataError message of opening `path`, or "" if it opened.
std::string open_error(const std::string& path) {
  return test::data_error([&] { TokenFile file(path); });
}

std::string escaped(const std::string& s) { return std::regex_replace(s, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"); }

TEST(TokenFile, WriteThenReadRoundTrips) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 256, 65535, 42};
  write_token_file(dir.file("t.bin"), tokens);
  EXPECT_EQ(fs::file_size(dir.file("t.bin")), static_cast<uintmax_t>(token_file_bytes(5)));
  TokenFile file(dir.file("t.bin"));
  EXPECT_EQ(file.size(), 5);
  EXPECT_EQ(file.path(), dir.file("t.bin"));
  EXPECT_EQ(std::vector<uint16_t>(file.tokens().begin(), file.tokens().end()), tokens);
  EXPECT_EQ(file.max_token(), 65535);
  // llm.c header layout, byte for byte.
  const std::vector<char> bytes = read_bytes(dir.file("t.bin"));
  int32_t header[4];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  EXPECT_EQ(header[3], 0);
  // Nothing but the final file is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

RC_GTEST_PROP(TokenFile, RoundTripsAnyTokens, (const std::vector<uint16_t>& tokens)) {
  TempDir dir;
  TokenFileWriter writer(dir.file("p.bin"));
  // Appended in two pieces: streaming equals one write.
  const size_t cut = tokens.size() / 3;
  writer.append(std::span<const uint16_t>(tokens).first(cut));
  writer.append(std::span<const uint16_t>(tokens).subspan(cut));
  writer.commit();
  TokenFile file(dir.file("p.bin"));
  RC_ASSERT(file.size() == static_cast<int64_t>(tokens.size()));
  RC_ASSERT(std::vector<uint16_t>(file.tokens().begin(), file.tokens().end()) == tokens);
}

TEST(TokenFile, UncommittedWriterLeavesNothing) {
  TempDir dir;
  {
    TokenFileWriter writer(dir.file("half.bin"));
    writer.append(uint16_t{7});
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(TokenFile, RewriteReplacesAtomically) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{1, 2, 3});
  TokenFile old_file(dir.file("t.bin"));  // a reader of the old file keeps its mapping
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{9});
  EXPECT_EQ(old_file.size(), 3);
  EXPECT_EQ(old_file[2], 3);
  EXPECT_EQ(TokenFile(dir.file("t.bin")).size(), 1);
}

TEST(TokenFile, MoveKeepsTheMapping) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{4, 5});
  TokenFile a(dir.file("t.bin"));
  TokenFile b(std::move(a));
  EXPECT_EQ(b.size(), 2);
  EXPECT_EQ(b[1], 5);
}

TEST(TokenFile, RejectsMissingFile) {
  TempDir dir;
  EXPECT_TRUE(matches(open_error(dir.file("none.bin")), escaped(dir.file("none.bin")) + ": cannot open token file: No such file.*"));
}

TEST(TokenFile, RejectsFileShorterThanHeader) {
  TempDir dir;
  write_bytes(dir.file("short.bin"), std::vector<char>(100, 0));
  EXPECT_TRUE(matches(open_error(dir.file("short.bin")), escaped(dir.file("short.bin")) +
                                    ": truncated: file has 100 bytes, shorter than the 1024-byte header"));
  write_bytes(dir.file("empty.bin"), {});
  EXPECT_TRUE(matches(open_error(dir.file("empty.bin")), ".*: truncated: file has 0 bytes, .*"));
}

TEST(TokenFile, RejectsBadMagicWithRegenerateHint) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{1, 2});
  patch_header(dir.file("t.bin"), 0, 20240519);  // header[0]: magic
  EXPECT_TRUE(matches(open_error(dir.file("t.bin")), escaped(dir.file("t.bin")) +
                                    ": bad magic: header\\[0\\] is 20240519, expected 20240520 .*"
                                    "`lockstep data build --input .*`"));
}

TEST(TokenFile, RejectsUnsupportedVersion) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{1, 2});
  patch_header(dir.file("t.bin"), 1, 2);  // header[1]: version
  EXPECT_TRUE(matches(open_error(dir.file("t.bin")), escaped(dir.file("t.bin")) +
                                    ": unsupported version: header\\[1\\] is 2, expected 1; .*"));
}

TEST(TokenFile, RejectsTruncatedTokens) {
  TempDir dir;
  write_token_file(dir.file("train.bin"), std::vector<uint16_t>(1000, 3));
  fs::resize_file(dir.file("train.bin"), 1024 + 1500);
  EXPECT_TRUE(matches(open_error(dir.file("train.bin")), escaped(dir.file("train.bin")) +
                                    ": truncated: header says 1000 tokens \\(3024 bytes\\) but file has 2524 bytes"));
}

TEST(TokenFile, RejectsTrailingBytes) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>(10, 3));
  fs::resize_file(dir.file("t.bin"), 1024 + 21);
  EXPECT_TRUE(matches(open_error(dir.file("t.bin")), escaped(dir.file("t.bin")) +
                                    ": trailing bytes: header says 10 tokens \\(1044 bytes\\) but file has 1045 bytes"));
}

TEST(TokenFile, RejectsNegativeCount) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{});
  patch_header(dir.file("t.bin"), 2, -4);  // header[2]: count
  EXPECT_TRUE(matches(open_error(dir.file("t.bin")), escaped(dir.file("t.bin")) + ": bad token count: header\\[2\\] is -4, expected >= 0"));
}

TEST(TokenFile, ChecksTokensAgainstVocabulary) {
  TempDir dir;
  write_token_file(dir.file("t.bin"), std::vector<uint16_t>{1, 256, 300, 2});
  TokenFile file(dir.file("t.bin"));
  EXPECT_NO_THROW(file.check_vocab(301));
  try {
    file.check_vocab(257);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_TRUE(matches(e.what(), escaped(dir.file("t.bin")) +
                                                ": token out of range: position 2 holds 300, expected < vocab_size 257"));
  }
}

// The scans read a file in runs of 1 MiB of its bytes (the header's 1,024 among the first run's):
// a token on either side of a boundary between runs, and the last one, are each read once.
TEST(TokenFile, ScansReadEveryTokenAcrossRuns) {
  TempDir dir;
  const int64_t first_run = ((int64_t{1} << 20) - kTokenFileHeaderBytes) / 2;  // tokens in the first run
  std::vector<uint16_t> tokens(static_cast<size_t>(3 * first_run), 7);
  for (const int64_t at : {first_run - 1, first_run, static_cast<int64_t>(tokens.size()) - 1}) {
    tokens[static_cast<size_t>(at)] = 500;
    write_token_file(dir.file("t.bin"), tokens);
    TokenFile file(dir.file("t.bin"));
    EXPECT_EQ(file.max_token(), 500) << at;
    try {
      file.check_vocab(100);
      FAIL() << "expected DataError";
    } catch (const DataError& e) {
      EXPECT_TRUE(matches(e.what(), escaped(dir.file("t.bin")) + str_cat(": token out of range: position ", at,
                                                                         " holds 500, expected < vocab_size 100")));
    }
    EXPECT_EQ(file[at], 500);  // read in place after the scan gave its pages back
    tokens[static_cast<size_t>(at)] = 7;
  }
}

}  // namespace
}  // namespace lockstep::data
