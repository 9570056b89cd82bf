#include "src/cli/args.hpp"

#include "src/core/check.hpp"

namespace lockstep::cli {

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positionals_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    } else {
      value = "true";
    }
    LS_REQUIRE(!options_.count(key), "option --", key, " given twice");
    options_[key] = value;
    order_.push_back(key);
  }
}

std::optional<std::string> Args::take(const std::string& key) {
  auto it = options_.find(key);
  if (it == options_.end()) return std::nullopt;
  std::string v = it->second;
  options_.erase(it);
  return v;
}

std::string Args::take_or(const std::string& key, const std::string& fallback) {
  return take(key).value_or(fallback);
}

bool Args::take_flag(const std::string& key) {
  auto v = take(key);
  if (!v) return false;
  LS_REQUIRE(*v == "true" || *v == "false", "option --", key, " expects true or false, got '", *v, "'");
  return *v == "true";
}

std::vector<std::pair<std::string, std::string>> Args::take_dotted() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& key : order_) {
    auto it = options_.find(key);
    if (it != options_.end() && key.find('.') != std::string::npos) {
      out.emplace_back(key, it->second);
      options_.erase(it);
    }
  }
  return out;
}

void Args::finish(const std::string& command) const {
  if (!options_.empty()) {
    throw ConfigError(str_cat("lockstep ", command, ": unknown option --", options_.begin()->first));
  }
}

int64_t parse_count(const std::string& command, const std::string& key, const std::string& value) {
  LS_REQUIRE(!value.empty() && value.find_first_not_of("0123456789") == std::string::npos && value.size() < 12,
             command, ": --", key, " expects a non-negative integer, got '", value, "'");
  return std::stoll(value);
}

}  // namespace lockstep::cli
