#include "src/train/toml_file.hpp"

#include "src/core/check.hpp"

namespace lockstep {

toml::table parse_toml_file(const std::string& path) {
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigError(str_cat(path, ":", where.line, ":", where.column, ": ", e.description()));
  }
}

}  // namespace lockstep
