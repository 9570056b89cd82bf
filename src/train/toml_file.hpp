// A TOML file parsed (toml++), or one ConfigError "PATH:LINE:COLUMN: what" for a syntax error: the
// run configs (config.cpp) and the planner's cluster files (src/plan/cluster.cpp).
#pragma once

#include <string>

#include <toml++/toml.h>

namespace lockstep {

toml::table parse_toml_file(const std::string& path);

}  // namespace lockstep
