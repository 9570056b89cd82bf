#include "verify/metrics_records.hpp"

#include <fstream>

#include "src/core/check.hpp"

namespace lockstep::verify {

void for_each_metrics_record(const std::string& path,
                             const std::function<void(const nlohmann::json& record, int64_t line)>& record) {
  std::ifstream in(path);
  LS_REQUIRE_DATA(in.good(), path, ": cannot read the metrics file");
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(str_cat(path, ":", n, ": not a JSON object (", e.what(), ")"));
    }
    record(j, n);
  }
}

}  // namespace lockstep::verify
