#include "src/optim/decay_policy.hpp"

#include "src/core/check.hpp"

namespace lockstep {

DecayPolicy DecayPolicy::parse(std::string_view list, const std::string& where) {
  DecayPolicy p;
  p.classes.fill(false);
  if (list.empty() || list == "none") return p;
  std::string known;
  for (int c = 0; c < kNumParamClasses; ++c)
    known += std::string(c ? ", " : "") + "\"" + std::string(param_class_name(static_cast<ParamClass>(c))) + "\"";
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view name = list.substr(start, comma - start);
    int found = -1;
    for (int c = 0; c < kNumParamClasses; ++c)
      if (name == param_class_name(static_cast<ParamClass>(c))) found = c;
    LS_REQUIRE(found >= 0, where, ": unknown parameter class \"", name, "\" in \"", list,
               "\"; expected a comma-separated list of ", known, ", or \"none\"");
    LS_REQUIRE(!p.classes[static_cast<size_t>(found)], where, ": \"", name, "\" named twice in \"", list, "\"");
    p.classes[static_cast<size_t>(found)] = true;
    start = comma + 1;
  }
  return p;
}

}  // namespace lockstep
