// Checking error messages in tests: the message of the exception a call throws, and a full-match
// regex assertion that shows both the message and the pattern when it fails.
#pragma once

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "src/core/check.hpp"

namespace lockstep::test {

// The what() of the E that `f()` throws, or "" if it returns normally (other exceptions propagate).
template <class E, class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

template <class F>
std::string config_error(F&& f) {
  return error_message<ConfigError>(f);
}

template <class F>
std::string data_error(F&& f) {
  return error_message<DataError>(f);
}

// True if all of `text` matches the ECMAScript regex `pattern`; the failure shows both.
inline testing::AssertionResult matches(const std::string& text, const std::string& pattern) {
  if (std::regex_match(text, std::regex(pattern))) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "message: " << text << "\n  pattern: " << pattern;
}

}  // namespace lockstep::test
