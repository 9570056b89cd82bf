// Byte-level tokenizer (see tokenizer.hpp).
#include "src/data/tokenizer.hpp"

#include "src/core/check.hpp"

namespace lockstep::data {

namespace {

void require_token(uint16_t token, size_t position) {
  if (token >= kByteVocabSize) {
    throw DataError(str_cat("byte tokenizer: token ", token, " at position ", position,
                            " is outside the vocabulary (expected < ", kByteVocabSize, ")"));
  }
}

}  // namespace

std::vector<uint16_t> byte_encode(std::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::vector<uint16_t> byte_encode_documents(std::span<const std::string> documents) {
  std::vector<uint16_t> tokens;
  for (size_t d = 0; d < documents.size(); ++d) {
    if (d > 0) tokens.push_back(static_cast<uint16_t>(kByteEot));
    for (char c : documents[d]) tokens.push_back(static_cast<unsigned char>(c));
  }
  return tokens;
}

std::string byte_decode(std::span<const uint16_t> tokens, std::string_view eot_text) {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    require_token(tokens[i], i);
    if (tokens[i] == kByteEot) {
      text += eot_text;
    } else {
      text.push_back(static_cast<char>(tokens[i]));
    }
  }
  return text;
}

std::vector<std::string> byte_decode_documents(std::span<const uint16_t> tokens) {
  std::vector<std::string> documents(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    require_token(tokens[i], i);
    if (tokens[i] == kByteEot) {
      documents.emplace_back();
    } else {
      documents.back().push_back(static_cast<char>(tokens[i]));
    }
  }
  return documents;
}

}  // namespace lockstep::data
