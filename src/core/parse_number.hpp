// A whole string read as a number in std::stod's syntax, or nothing where any of it is not:
// "1.5" -> 1.5; "", "x", "1.5x" -> nullopt. Callers word their own errors.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace lockstep {

inline std::optional<double> parse_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return v;
}

}  // namespace lockstep
