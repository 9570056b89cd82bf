// Errors and always-on checks.
//
// ConfigError: bad user input (config, CLI, data or checkpoint files). Thrown where the input is
// read, with every operand and the expectation in the message. The CLI prints it as one line and
// exits non-zero (once for a multi-rank job: src/cli/main.cpp).
// LS_CHECK: internal invariants. On in every build type (like GGML_ASSERT); failure names file:line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

// What the user can fix: the two below.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a config key, a value, a file. The message names what and why.
class ConfigError : public InputError {
 public:
  using InputError::InputError;
};

// A file that exists but cannot be used: bad magic, truncated, checksum mismatch.
class DataError : public InputError {
 public:
  using InputError::InputError;
};

// A broken internal invariant: a bug in Lockstep, not in the user's input.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace lockstep

#define LS_REQUIRE(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) throw ::lockstep::ConfigError(::lockstep::str_cat(__VA_ARGS__));      \
  } while (0)

// The same for a file that exists but cannot be used (DataError).
#define LS_REQUIRE_DATA(cond, ...)                                                     \
  do {                                                                                 \
    if (!(cond)) throw ::lockstep::DataError(::lockstep::str_cat(__VA_ARGS__));        \
  } while (0)

#define LS_CHECK(cond, ...)                                                            \
  do {                                                                                 \
    if (!(cond))                                                                       \
      throw ::lockstep::InternalError(::lockstep::str_cat(                             \
          __FILE__, ":", __LINE__, ": check failed: " #cond " ", ##__VA_ARGS__));      \
  } while (0)
