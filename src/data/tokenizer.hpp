// The byte-level tokenizer: token t in [0, 256) is the byte t; token 256 (kByteEot) separates
// documents. Its vocabulary therefore has 257 entries. Encoding is lossless for any bytes (UTF-8
// or not); decoding maps the separator to a caller-chosen text.
// Not a BPE tokenizer and not a normaliser: no merges, no Unicode handling, no added BOS token.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::data {

inline constexpr int32_t kByteEot = 256;        // end-of-text: between two documents
inline constexpr int32_t kByteVocabSize = 257;  // 256 bytes + kByteEot

// Tokens of one document: one per byte, no separator.
std::vector<uint16_t> byte_encode(std::string_view text);

// Tokens of several documents joined by kByteEot: n documents give n - 1 separators.
std::vector<uint16_t> byte_encode_documents(std::span<const std::string> documents);

// Inverse of byte_encode_documents up to the separator: every kByteEot becomes `eot_text`.
// Throws DataError naming the position of a token >= kByteVocabSize.
std::string byte_decode(std::span<const uint16_t> tokens, std::string_view eot_text = "\n<|endoftext|>\n");

// Exact inverse of byte_encode_documents: the documents between separators.
std::vector<std::string> byte_decode_documents(std::span<const uint16_t> tokens);

}  // namespace lockstep::data
