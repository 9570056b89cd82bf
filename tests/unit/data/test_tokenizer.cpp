// Byte tokenizer: round trips over arbitrary bytes and documents, separator placement, rejection
// of tokens outside the vocabulary.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/data/tokenizer.hpp"
#include "tests/support/errors.hpp"

namespace lockstep::data {
namespace {

using test::matches;

TEST(ByteTokenizer, EncodesBytesAsTheirValues) {
  const std::string text("a\n\xff\0z", 5);  // with a NUL byte inside
  const std::vector<uint16_t> tokens = byte_encode(text);
  EXPECT_EQ(tokens, (std::vector<uint16_t>{97, 10, 255, 0, 122}));
}

TEST(ByteTokenizer, SeparatesDocumentsWithEot) {
  const std::vector<std::string> docs = {"ab", "", "c"};
  EXPECT_EQ(byte_encode_documents(docs), (std::vector<uint16_t>{97, 98, 256, 256, 99}));
  EXPECT_EQ(byte_decode(byte_encode_documents(docs), "|"), "ab||c");
  EXPECT_TRUE(byte_encode_documents(std::vector<std::string>{"only"}) == byte_encode("only"));
}

RC_GTEST_PROP(ByteTokenizer, RoundTripsArbitraryBytes, (const std::string& text)) {
  RC_ASSERT(byte_decode(byte_encode(text)) == text);
}

RC_GTEST_PROP(ByteTokenizer, RoundTripsDocuments, (const std::vector<std::string>& docs)) {
  RC_PRE(!docs.empty());  // zero documents and one empty document both encode to no token
  RC_ASSERT(byte_decode_documents(byte_encode_documents(docs)) == docs);
}

TEST(ByteTokenizer, RejectsTokensOutsideTheVocabulary) {
  const std::vector<uint16_t> tokens = {97, 257};
  EXPECT_THROW(
      {
        try {
          byte_decode(tokens);
        } catch (const DataError& e) {
          EXPECT_TRUE(matches(e.what(), ".*token 257 at position 1 .*expected < 257.*"));
          throw;
        }
      },
      DataError);
}

}  // namespace
}  // namespace lockstep::data
