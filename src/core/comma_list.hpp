// A config value that lists names separated by commas: "a,b,c" -> {"a", "b", "c"}; "" -> {};
// empty items are kept ("a,,b" has three), for the caller to refuse with its own message.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

namespace lockstep {

inline std::vector<std::string_view> split_commas(std::string_view list) {
  std::vector<std::string_view> items;
  if (list.empty()) return items;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    items.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

}  // namespace lockstep
