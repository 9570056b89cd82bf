#include "src/optim/decay_policy.hpp"

#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"

namespace lockstep {

DecayPolicy DecayPolicy::parse(std::string_view list, const std::string& where) {
  DecayPolicy p;
  p.classes.fill(false);
  if (list.empty() || list == "none") return p;
  std::string known;
  for (int c = 0; c < kNumParamClasses; ++c)
    known += std::string(c ? ", " : "") + "\"" + std::string(param_class_name(static_cast<ParamClass>(c))) + "\"";
  for (const std::string_view name : split_commas(list)) {
    int found = -1;
    for (int c = 0; c < kNumParamClasses; ++c)
      if (name == param_class_name(static_cast<ParamClass>(c))) found = c;
    LS_REQUIRE(found >= 0, where, ": unknown parameter class \"", name, "\" in \"", list,
               "\"; expected a comma-separated list of ", known, ", or \"none\"");
    LS_REQUIRE(!p.classes[static_cast<size_t>(found)], where, ": \"", name, "\" named twice in \"", list, "\"");
    p.classes[static_cast<size_t>(found)] = true;
  }
  return p;
}

}  // namespace lockstep
