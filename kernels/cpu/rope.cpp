// Rotary position embedding (RoPE) on the CPU: tables, forward and backward (contract in
// kernels/ops/attention.hpp). No reductions, so there is one mode.
//
// Tables: inv_freq_i = theta^(-2i/HS) = exp(−(2i/HS)·log theta) and angle = t·inv_freq_i in
// double, then cos/sin of the angle, rounded once to fp32. exp, log, sin and cos are the
// deterministic ones of src/core/det_math.hpp (libm's differ between versions, and a table entry
// that differs by one ulp changes every step after it). Accuracy of the double values: a few ulp of double in exp/log/sin/cos, the angle
// off by at most ~T·2^-50 absolute; the fp32 tables are therefore within one fp32 rounding
// (u·|value|) plus T·2^-49 of the exact cos/sin(t·theta^(-2i/HS)) — checked against MPFR by
// tests/unit/kernels_attention.
//
// Rotation of each pair (x, y) = (p[i], p[i + HS/2]) in fp32, no fma, products rounded first:
//   x' = (x·c) − (y·s),  y' = (x·s) + (y·c)
// and backward, the transpose:  dx = (dx'·c) + (dy'·s),  dy = (dy'·c) − (dx'·s).
//
// Not here: attention itself (attention.cpp); NTK/YaRN-style frequency scaling.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops/rope.hpp"
#include "src/core/check.hpp"
#include "src/core/det_math.hpp"

namespace lockstep::cpu {
namespace {

void check_rope_shape(AttentionShape s, const char* op) {
  LS_REQUIRE(s.B > 0 && s.T > 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0, op,
             ": B, T, NH, NKV, HS must be positive (got B=", s.B, " T=", s.T, " NH=", s.NH,
             " NKV=", s.NKV, " HS=", s.HS, ")");
  LS_REQUIRE(s.HS % 2 == 0, op, ": RoPE needs an even head size (HS=", s.HS, ")");
}

// Applies the rotation, or its transpose, to the q and k heads of every row (v is untouched).
void rotate(AttentionShape s, float* p, const float* cos_table, const float* sin_table,
            bool transpose) {
  const int64_t row = (s.NH + 2 * s.NKV) * s.HS, half = s.HS / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t t = 0; t < s.T; ++t) {
      const float* cs = cos_table + t * half;
      const float* sn = sin_table + t * half;
      for (int64_t head = 0; head < s.NH + s.NKV; ++head) {  // q heads then k heads
        float* x = p + (b * s.T + t) * row + head * s.HS;
        float* y = x + half;
        for (int64_t i = 0; i < half; ++i) {
          const float xi = x[i], yi = y[i], c = cs[i], sv = sn[i];
          if (!transpose) {
            x[i] = xi * c - yi * sv;
            y[i] = xi * sv + yi * c;
          } else {
            // forward: x' = x·c − y·s, y' = x·s + y·c  =>  dx = dx'·c + dy'·s, dy = dy'·c − dx'·s
            x[i] = xi * c + yi * sv;
            y[i] = yi * c - xi * sv;
          }
        }
      }
    }
  }
}

}  // namespace

void rope_tables(int64_t T, int64_t HS, double theta, float* cos_table, float* sin_table) {
  LS_REQUIRE(T > 0 && HS > 0 && HS % 2 == 0, "rope_tables: T must be positive and HS even (T=", T,
             " HS=", HS, ")");
  LS_REQUIRE(theta > 1 && std::isfinite(theta), "rope_tables: theta must be finite and > 1 (got ",
             theta, ")");
  LS_REQUIRE(static_cast<double>(T) <= det::kMaxAngle, "rope_tables: T (", T, ") above ", det::kMaxAngle,
             " positions is not supported by the angle reduction");
  const int64_t half = HS / 2;
  const double log_theta = det::log(theta);
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = det::exp(-(static_cast<double>(2 * i) / static_cast<double>(HS)) * log_theta);
    for (int64_t t = 0; t < T; ++t) {
      double c, sn;
      det::cos_sin(static_cast<double>(t) * inv_freq, &c, &sn);
      cos_table[t * half + i] = static_cast<float>(c);
      sin_table[t * half + i] = static_cast<float>(sn);
    }
  }
}

void rope_forward(AttentionShape s, float* qkv, const float* cos_table, const float* sin_table) {
  check_rope_shape(s, "rope_forward");
  rotate(s, qkv, cos_table, sin_table, /*transpose=*/false);
}

void rope_backward(AttentionShape s, float* dqkv, const float* cos_table, const float* sin_table) {
  check_rope_shape(s, "rope_backward");
  rotate(s, dqkv, cos_table, sin_table, /*transpose=*/true);
}

}  // namespace lockstep::cpu
