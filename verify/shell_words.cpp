// Shell-like word splitting and quoting (shell_words.hpp).
#include "verify/shell_words.hpp"

#include <utility>

#include "src/core/check.hpp"

namespace lockstep::verify {

std::vector<std::string> split_shell_words(const std::string& text, const std::string& what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word), word.clear(), in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      LS_REQUIRE(end != std::string::npos, what, ": unterminated ' in \"", text, "\"");
      word += text.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::string("\"\\$`").find(text[j + 1]) != std::string::npos) {
          ++j;
        } else {
          LS_REQUIRE(text[j] != '$' && text[j] != '`', what, ": \"", text,
                     "\" asks for shell expansion ($ or `), which bisect does not perform; quote it with '...'");
        }
        word += text[j];
      }
      LS_REQUIRE(j < text.size(), what, ": unterminated \" in \"", text, "\"");
      i = j;
    } else if (c == '\\') {
      LS_REQUIRE(i + 1 < text.size(), what, ": \"", text, "\" ends in a lone backslash");
      word += text[++i];
    } else {
      LS_REQUIRE(std::string("|&;<>()$`*?[~").find(c) == std::string::npos, what, ": \"", text,
                 "\" holds '", std::string(1, c),
                 "', which a shell would not pass through as text; quote it with '...' if it is meant literally");
      word += c;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

std::string quote_shell_word(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_./=:,+@%") == std::string::npos;
  if (safe) return word;
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_shell_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += quote_shell_word(w);
  }
  return out;
}

std::vector<std::string> launcher_words(const std::string& launcher, int64_t np, const std::string& what) {
  std::vector<std::string> words;
  if (np <= 1) return words;
  for (std::string w : split_shell_words(launcher, what)) {
    if (const size_t at = w.find("{np}"); at != std::string::npos) w.replace(at, 4, std::to_string(np));
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace lockstep::verify
