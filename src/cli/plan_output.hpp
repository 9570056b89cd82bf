// What `lockstep plan` prints and writes beside its ranking (cmd_plan.cpp): a prediction as JSON,
// and `--validate`'s table of predicted against measured (verify/plan_validate.hpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/plan/planner.hpp"
#include "verify/plan_validate.hpp"

namespace lockstep::cli {

// x with `digits` decimals.
std::string fixed(double x, int digits);

nlohmann::json to_json(const plan::Prediction& p);

// Runs the layouts that fit (`ranked`; or those `only` names, a comma list, each of which must
// fit), each predicted from its passes and collectives timed again just before its run (into
// `profile`, which the planner reads, and the planner's links), prints the table and the errors'
// summary, and returns them as JSON.
nlohmann::json validate_plan(const verify::ValidateOptions& opt, plan::Planner& planner, plan::ComputeProfile& profile,
                             const std::vector<plan::Prediction>& ranked, const std::string& only);

}  // namespace lockstep::cli
