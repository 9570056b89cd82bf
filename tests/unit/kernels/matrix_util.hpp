// Test helpers for the GEMM tests: strided matrix views over owned buffers (row-major, transposed,
// padded, negative strides) and the scalar specification of a canonical product
// (kernels/ops/canonical.hpp applied element by element). The random and adversarial fp32 fills
// are in tests/support/random_values.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/ops/canonical.hpp"
#include "tests/support/random_values.hpp"

namespace lockstep::test {

// A rows x cols matrix stored in a buffer with strides (srow, scol), any sign; `at` is element
// (0,0). Layout codes: 0 row-major, 1 column-major, 2 row-major padded, 3 column-major padded,
// 4 row-major with rows reversed (negative row stride), 5 column-major with columns reversed.
struct StridedMatrix {
  int64_t rows = 0, cols = 0, srow = 0, scol = 0;
  std::vector<float> buf;
  float* at = nullptr;

  StridedMatrix(int64_t r, int64_t c, int layout) : rows(r), cols(c) {
    const int64_t pad = (layout == 2 || layout == 3) ? 3 : 0;
    const bool col_major = layout == 1 || layout == 3 || layout == 5;
    const int64_t ld = (col_major ? r : c) + pad;
    const int64_t outer = col_major ? c : r;
    buf.assign(static_cast<size_t>(std::max<int64_t>(1, ld * std::max<int64_t>(outer, 1))),
               std::numeric_limits<float>::quiet_NaN());  // padding must never be read
    srow = col_major ? 1 : ld;
    scol = col_major ? ld : 1;
    at = buf.data();
    if (layout == 4 && r > 0) {
      at += (r - 1) * ld;
      srow = -ld;
    }
    if (layout == 5 && c > 0) {
      at += (c - 1) * ld;
      scol = -ld;
    }
  }
  float& operator()(int64_t i, int64_t j) { return at[i * srow + j * scol]; }
};
inline constexpr int kLayouts = 6;

// C_spec[m,n] = canonical_dot(A row m, B column n): the bitwise specification.
inline std::vector<float> canonical_product_spec(int64_t M, int64_t N, int64_t K,
                                                 const float* A, int64_t sam, int64_t sak,
                                                 const float* B, int64_t sbk, int64_t sbn) {
  std::vector<float> C(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) C[m * N + n] = canonical_dot(A + m * sam, sak, B + n * sbn, sbk, K);
  }
  return C;
}

}  // namespace lockstep::test
