// Reading a run's metrics JSONL (src/train/metrics.hpp writes it): each record in file order, with
// its line number for messages. The reports over a run's records (`lockstep fp8 report`,
// `lockstep moe report`) read it through this.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep::verify {

// Calls `record` with each non-empty line's JSON and its line number; DataError naming the file
// (and the line) when it cannot be read or a line is not JSON.
void for_each_metrics_record(const std::string& path,
                             const std::function<void(const nlohmann::json& record, int64_t line)>& record);

}  // namespace lockstep::verify
