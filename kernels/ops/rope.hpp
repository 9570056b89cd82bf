// Rotary position embedding (RoPE, rotate-half convention as in Llama): for each q and k head of
// the attention's qkv rows (attention.hpp's layout), pairs (x[i], x[i + HS/2]) rotated by angle
// t·theta^(-2i/HS). cos/sin tables are (T, HS/2) fp32, built once by rope_tables: inv_freq_i =
// exp(−(2i/HS)·log theta) and angle = t·inv_freq_i in double with the project's own exp, log,
// sin and cos (src/core/det_math.hpp), so that the tables are identical on every machine, then
// rounded once to fp32. rope_forward rotates qkv in place; rope_backward rotates dqkv back (the
// transpose of the rotation) in place. v is untouched. Rotation of each pair (x, y) in fp32, no
// FMA, products rounded first:
//   x' = (x·c) − (y·s),  y' = (x·s) + (y·c);   backward  dx = (dx'·c) + (dy'·s),  dy = (dy'·c) − (dx'·s)
// No reductions: one mode.
#pragma once

#include <cstdint>

#include "kernels/ops/attention.hpp"

namespace lockstep::cpu {

void rope_tables(int64_t T, int64_t HS, double theta,
                 float* cos_table, float* sin_table);             // (T, HS/2) (T, HS/2)
void rope_forward(AttentionShape s,
                  float* qkv,                                     // (B, T, (NH+2NKV)*HS) in place
                  const float* cos_table, const float* sin_table);
void rope_backward(AttentionShape s,
                   float* dqkv,                                   // (B, T, (NH+2NKV)*HS) in place
                   const float* cos_table, const float* sin_table);

}  // namespace lockstep::cpu
