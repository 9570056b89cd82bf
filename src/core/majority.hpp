// Triple modular redundancy for words that ranks must agree on: a word sent three times is read
// as the bitwise majority of its copies, right whatever the corruption of any one copy.
#pragma once

#include <cstdint>

namespace lockstep {

inline uint64_t majority(uint64_t a, uint64_t b, uint64_t c) { return (a & b) | (a & c) | (b & c); }

}  // namespace lockstep
