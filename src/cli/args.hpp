// Command-line arguments of a `lockstep` subcommand: positionals and `--key=value` / `--key value`
// options (dotted keys such as `--train.lr=3e-4` are config overrides). Every option must be
// consumed by the command; leftovers are reported as unknown (ConfigError) by finish().
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::cli {

class Args {
 public:
  Args(int argc, char** argv, int first);  // argv[first..argc)

  const std::vector<std::string>& positionals() const { return positionals_; }

  // Removes and returns an option's value; nullopt if absent. A flag given without a value
  // reads as "true".
  std::optional<std::string> take(const std::string& key);
  std::string take_or(const std::string& key, const std::string& fallback);
  bool take_flag(const std::string& key);
  // Removes and returns every remaining option whose key contains a '.' (config overrides).
  std::vector<std::pair<std::string, std::string>> take_dotted();

  // Throws ConfigError naming the first option nobody took.
  void finish(const std::string& command) const;

 private:
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> options_;
  std::vector<std::string> order_;  // options in the order given, for overrides
};

// A non-negative integer option's value; ConfigError "COMMAND: --KEY expects a non-negative
// integer, got 'VALUE'" otherwise.
int64_t parse_count(const std::string& command, const std::string& key, const std::string& value);

}  // namespace lockstep::cli
