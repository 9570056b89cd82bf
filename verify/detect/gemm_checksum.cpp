#include "verify/detect/gemm_checksum.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/core/check.hpp"
#include "verify/core/bounds.hpp"

namespace lockstep::detect {

namespace {

constexpr int64_t kTileRows = 64;      // rows per partial column sum
constexpr int64_t kParallelElements = int64_t{1} << 15;

double* grown(std::vector<double>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The loops below are compiled for AVX2 (this file's baseline) and AVX-512; function
// multiversioning picks one when the program loads. Their sums' order follows the vector width, so
// the checksums' last bits may differ between the two (the thresholds hold for any order).
#define LS_CHECKSUM_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))

// Rows [i0, i1) of the row-major R × S matrix X: sum[i] = Σ_s X[i,s]·v[s], mag[i] = Σ_s
// |X[i,s]|·va[s] (v == nullptr: every weight 1; mag == nullptr: the sums alone, unweighted), and
// where plain is given the unweighted ones
// plain[i] = Σ_s X[i,s], plain_mag[i] = Σ_s |X[i,s]| in the same pass.
template <class T>
[[gnu::always_inline]] inline void row_block(const T* X, int64_t S, int64_t i0, int64_t i1, const double* v,
                                             const double* va, double* sum, double* mag, double* plain,
                                             double* plain_mag) {
  for (int64_t i = i0; i < i1; ++i) {
    const T* x = X + i * S;
    double r = 0, ra = 0, p = 0, pa = 0;
    if (v == nullptr && mag == nullptr) {
#pragma omp simd reduction(+ : r)
      for (int64_t s = 0; s < S; ++s) r += static_cast<double>(x[s]);
    } else if (v == nullptr) {
#pragma omp simd reduction(+ : r, ra)
      for (int64_t s = 0; s < S; ++s) {
        const auto xs = static_cast<double>(x[s]);
        r += xs;
        ra += std::fabs(xs);
      }
    } else if (plain == nullptr) {
#pragma omp simd reduction(+ : r, ra)
      for (int64_t s = 0; s < S; ++s) {
        const auto xs = static_cast<double>(x[s]);
        r += xs * v[s];
        ra += std::fabs(xs) * va[s];
      }
    } else {
#pragma omp simd reduction(+ : r, ra, p, pa)
      for (int64_t s = 0; s < S; ++s) {
        const auto xs = static_cast<double>(x[s]);
        r += xs * v[s];
        ra += std::fabs(xs) * va[s];
        p += xs;
        pa += std::fabs(xs);
      }
      plain[i] = p;
      plain_mag[i] = pa;
    }
    sum[i] = r;
    if (mag != nullptr) mag[i] = ra;
  }
}

// One tile, rows [i0, i1): c[s] = Σ_i u[i]·X[i,s], ca[s] = Σ_i ua[i]·|X[i,s]| (u == nullptr:
// every weight 1; c and ca start at zero), and where row_sum is given row_block's row sums with v,
// va (v == nullptr: every weight 1) in the same pass. Four rows at a time: c and ca are loaded and stored once per four rows.
template <class T>
[[gnu::always_inline]] inline void col_tile(const T* X, int64_t S, int64_t i0, int64_t i1, const double* u,
                                            const double* ua, double* c, double* ca, const double* v,
                                            const double* va, double* row_sum, double* row_mag) {
  std::fill(c, c + S, 0.0);
  std::fill(ca, ca + S, 0.0);
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    const T *x0 = X + i * S, *x1 = x0 + S, *x2 = x1 + S, *x3 = x2 + S;
    const double w0 = u ? u[i] : 1.0, w1 = u ? u[i + 1] : 1.0, w2 = u ? u[i + 2] : 1.0, w3 = u ? u[i + 3] : 1.0;
    const double q0 = u ? ua[i] : 1.0, q1 = u ? ua[i + 1] : 1.0, q2 = u ? ua[i + 2] : 1.0, q3 = u ? ua[i + 3] : 1.0;
    if (row_sum == nullptr) {
#pragma omp simd
      for (int64_t s = 0; s < S; ++s) {
        const auto a0 = static_cast<double>(x0[s]), a1 = static_cast<double>(x1[s]);
        const auto a2 = static_cast<double>(x2[s]), a3 = static_cast<double>(x3[s]);
        c[s] += (w0 * a0 + w1 * a1) + (w2 * a2 + w3 * a3);
        ca[s] += (q0 * std::fabs(a0) + q1 * std::fabs(a1)) + (q2 * std::fabs(a2) + q3 * std::fabs(a3));
      }
      continue;
    }
    double r0 = 0, r1 = 0, r2 = 0, r3 = 0, ra0 = 0, ra1 = 0, ra2 = 0, ra3 = 0;
    if (u == nullptr && v == nullptr) {  // every weight 1: a matrix's plain row and column sums
#pragma omp simd reduction(+ : r0, r1, r2, r3, ra0, ra1, ra2, ra3)
      for (int64_t s = 0; s < S; ++s) {
        const auto a0 = static_cast<double>(x0[s]), a1 = static_cast<double>(x1[s]);
        const auto a2 = static_cast<double>(x2[s]), a3 = static_cast<double>(x3[s]);
        const double b0 = std::fabs(a0), b1 = std::fabs(a1), b2 = std::fabs(a2), b3 = std::fabs(a3);
        c[s] += (a0 + a1) + (a2 + a3);
        ca[s] += (b0 + b1) + (b2 + b3);
        r0 += a0, r1 += a1, r2 += a2, r3 += a3;
        ra0 += b0, ra1 += b1, ra2 += b2, ra3 += b3;
      }
    } else {
#pragma omp simd reduction(+ : r0, r1, r2, r3, ra0, ra1, ra2, ra3)
    for (int64_t s = 0; s < S; ++s) {
      const auto a0 = static_cast<double>(x0[s]), a1 = static_cast<double>(x1[s]);
      const auto a2 = static_cast<double>(x2[s]), a3 = static_cast<double>(x3[s]);
      const double b0 = std::fabs(a0), b1 = std::fabs(a1), b2 = std::fabs(a2), b3 = std::fabs(a3);
      c[s] += (w0 * a0 + w1 * a1) + (w2 * a2 + w3 * a3);
      ca[s] += (q0 * b0 + q1 * b1) + (q2 * b2 + q3 * b3);
      r0 += a0 * v[s], r1 += a1 * v[s], r2 += a2 * v[s], r3 += a3 * v[s];
      ra0 += b0 * va[s], ra1 += b1 * va[s], ra2 += b2 * va[s], ra3 += b3 * va[s];
    }
    }
    row_sum[i] = r0, row_sum[i + 1] = r1, row_sum[i + 2] = r2, row_sum[i + 3] = r3;
    row_mag[i] = ra0, row_mag[i + 1] = ra1, row_mag[i + 2] = ra2, row_mag[i + 3] = ra3;
  }
  for (; i < i1; ++i) {
    const T* x = X + i * S;
    const double ui = u ? u[i] : 1.0, uai = u ? ua[i] : 1.0;
    double r = 0, ra = 0;
    for (int64_t s = 0; s < S; ++s) {
      const auto xs = static_cast<double>(x[s]);
      c[s] += ui * xs;
      ca[s] += uai * std::fabs(xs);
      if (row_sum) r += xs * (v ? v[s] : 1.0), ra += std::fabs(xs) * (v ? va[s] : 1.0);
    }
    if (row_sum) row_sum[i] = r, row_mag[i] = ra;
  }
}

LS_CHECKSUM_CLONES void row_block_of(const float* X, int64_t S, int64_t i0, int64_t i1, const double* v,
                                     const double* va, double* sum, double* mag, double* plain, double* plain_mag) {
  row_block(X, S, i0, i1, v, va, sum, mag, plain, plain_mag);
}
LS_CHECKSUM_CLONES void row_block_of(const double* X, int64_t S, int64_t i0, int64_t i1, const double* v,
                                     const double* va, double* sum, double* mag, double* plain, double* plain_mag) {
  row_block(X, S, i0, i1, v, va, sum, mag, plain, plain_mag);
}
LS_CHECKSUM_CLONES void col_tile_of(const float* X, int64_t S, int64_t i0, int64_t i1, const double* u,
                                    const double* ua, double* c, double* ca, const double* v, const double* va,
                                    double* row_sum, double* row_mag) {
  col_tile(X, S, i0, i1, u, ua, c, ca, v, va, row_sum, row_mag);
}

// Row reductions of the row-major R × S matrix X (row_block), rows in parallel: each row on its
// own, the same on any threads.
template <class T>
void row_dots(const T* X, int64_t R, int64_t S, const double* v, const double* va, double* sum, double* mag,
              double* plain = nullptr, double* plain_mag = nullptr) {
  constexpr int64_t kRows = 8;
  const int64_t blocks = (R + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (R * S > kParallelElements)
  for (int64_t b = 0; b < blocks; ++b) {
    row_block_of(X, S, b * kRows, std::min(R, (b + 1) * kRows), v, va, sum, mag, plain, plain_mag);
  }
}

// Column reductions: sum[s] = Σ_i u[i]·X[i,s] and mag[s] = Σ_i ua[i]·|X[i,s]| (u == nullptr:
// every weight 1), by tiles of kTileRows rows in parallel whose partial sums are added in tile
// order; and, in the same pass where row_sum is given, the row reductions of row_dots with v, va.
template <class T>
void col_dots(const T* X, int64_t R, int64_t S, const double* u, const double* ua, double* sum, double* mag,
              std::vector<double>& scratch, const double* v = nullptr, const double* va = nullptr,
              double* row_sum = nullptr, double* row_mag = nullptr) {
  const int64_t tiles = (R + kTileRows - 1) / kTileRows;
  double* part = grown(scratch, 2 * tiles * S);
#pragma omp parallel for schedule(static) if (R * S > kParallelElements)
  for (int64_t t = 0; t < tiles; ++t) {
    double* c = part + 2 * t * S;
    col_tile_of(X, S, t * kTileRows, std::min(R, (t + 1) * kTileRows), u, ua, c, c + S, v, va, row_sum, row_mag);
  }
  std::fill(sum, sum + S, 0.0);
  std::fill(mag, mag + S, 0.0);
  for (int64_t t = 0; t < tiles; ++t) {
    const double* c = part + 2 * t * S;
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) {
      sum[s] += c[s];
      mag[s] += c[S + s];
    }
  }
}

int64_t logical_rows(const MatrixView& m) { return m.transposed ? m.cols : m.rows; }
int64_t logical_cols(const MatrixView& m) { return m.transposed ? m.rows : m.cols; }

// The logical operand's row reductions r[p] = Σ_q X[p,q]·v[q] (with magnitudes).
void rows_of(const MatrixView& m, const double* v, const double* va, double* r, double* ra, std::vector<double>& scratch) {
  if (m.transposed) {
    col_dots(m.data, m.rows, m.cols, v, va, r, ra, scratch);
  } else {
    row_dots(m.data, m.rows, m.cols, v, va, r, ra);
  }
}

void resize(ChecksumVector& c, int64_t n, bool slack) {
  c.sum.resize(static_cast<size_t>(n));
  c.mag.resize(static_cast<size_t>(n));
  c.slack.assign(slack ? static_cast<size_t>(n) : 0, 0.0);
}

}  // namespace

void observed_checksums(const ProductView& c, ChecksumVector& out, bool magnitudes) {
  resize(out, c.M, true);
  if (!magnitudes) out.mag.clear();
  double* mag = magnitudes ? out.mag.data() : nullptr;
  if (c.f32 != nullptr) {
    row_dots(c.f32, c.M, c.N, nullptr, nullptr, out.sum.data(), mag);
    return;
  }
  const ExactAccumulator& acc = *c.exact;
  const auto first = static_cast<size_t>(c.offset);
  row_dots(acc.partial_sums() + first, c.M, c.N, nullptr, nullptr, out.sum.data(), mag);
  if (acc.spill_count() == 0) return;
  // A spilled element's double is stale: its exact sum, rounded (to fp32: an error of at most
  // u·|value|, which joins the threshold), replaces it.
  const uint8_t* flags = acc.spill_flags() + first;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      const int64_t e = i * c.N + j;
      if (!flags[e]) continue;
      const double stale = acc.partial_sums()[first + static_cast<size_t>(e)];
      const double value = acc.spill(first + static_cast<size_t>(e)).round_to_float();
      out.sum[i] += value - stale;
      if (magnitudes) out.mag[i] += std::fabs(value) - std::fabs(stale);
      out.slack[i] += bounds::kUnitF32 * std::fabs(value);
    }
  }
}

void predicted_rows_times_transposed(const float* A, int64_t M, int64_t K, const float* W, int64_t N,
                                     ChecksumScratch& s, ChecksumVector& out, OperandRowSums& sums) {
  double* b = grown(s.v, K);
  double* ba = grown(s.v_abs, K);
  sums.a.resize(static_cast<size_t>(M)), sums.a_mag.resize(static_cast<size_t>(M));
  sums.w.resize(static_cast<size_t>(N)), sums.w_mag.resize(static_cast<size_t>(N));
  // b = (Wᵀ)·e = the column sums of W, with W's row sums in the same pass; then A·b with A's row sums.
  col_dots(W, N, K, nullptr, nullptr, b, ba, s.partial, nullptr, nullptr, sums.w.data(), sums.w_mag.data());
  resize(out, M, false);
  row_dots(A, M, K, b, ba, out.sum.data(), out.mag.data(), sums.a.data(), sums.a_mag.data());
}

void predicted_rows_from(const MatrixView& A, const double* b, const double* b_mag, ChecksumScratch& s,
                         ChecksumVector& out) {
  resize(out, logical_rows(A), false);
  rows_of(A, b, b_mag, out.sum.data(), out.mag.data(), s.partial);
}

void predicted_rows_sharing_a(const float* A, int64_t M, int64_t K, const double* b1, const double* b1_mag,
                              const double* b2, const double* b2_mag, ChecksumScratch& s, ChecksumVector& out1,
                              ChecksumVector& out2) {
  resize(out1, M, false);
  resize(out2, K, false);
  col_dots(A, M, K, b2, b2_mag, out2.sum.data(), out2.mag.data(), s.partial, b1, b1_mag, out1.sum.data(),
           out1.mag.data());
}

void operand_row_sums(const MatrixView& m, ChecksumScratch& s, std::vector<double>& sum, std::vector<double>& mag) {
  sum.resize(static_cast<size_t>(logical_rows(m)));
  mag.resize(sum.size());
  rows_of(m, nullptr, nullptr, sum.data(), mag.data(), s.partial);
}

int64_t rounding_chain(bool canonical, int64_t K, bool onto) {
  return canonical ? std::min<int64_t>(K, 64) + 2 : K + (onto ? 1 : 0);
}

ChecksumVerdict judge_checksums(const ChecksumVector& after, const ChecksumVector* before,
                                const ChecksumVector& predicted, int64_t length, const ProductRounding& rounding,
                                const std::vector<double>& extra) {
  const double g = bounds::gamma(rounding.chain, bounds::kUnitF32);
  // The checksums' own error in double (sums of at most K + length + a few terms, the observed
  // side a difference of two), and every fp32 rounding of the product underflowing.
  const auto n = static_cast<int64_t>(predicted.sum.size());
  const double gd = bounds::gamma(rounding.K + length + 8, bounds::kUnitF64);
  const double underflow =
      static_cast<double>(length) * static_cast<double>(rounding.K + 2) * bounds::kHalfMinSubnormalF32;
  ChecksumVerdict v;
  for (int64_t i = 0; i < n; ++i) {
    double observed = after.sum[i], slack = after.slack[i];
    double magnitude = predicted.mag[i] + (extra.empty() ? 0.0 : extra[i]);
    const double before_mag = before != nullptr ? before->mag[i] : 0.0;
    if (before != nullptr) {
      observed -= before->sum[i];
      slack += before->slack[i];
      if (rounding.before_in_chain) magnitude += before_mag;
    }
    // Σ_j |C[i,j]| after, where it was not summed: each element is within (1 + γ_L) of its terms'
    // magnitude (and C before), so within twice the computed one (γ_L < 1/2; the magnitudes' own
    // rounding in double is far below that).
    const double after_mag = after.mag.empty() ? 2 * (magnitude + before_mag) : after.mag[i];
    const double observed_mag = after_mag + before_mag;
    const double threshold =
        g * magnitude + rounding.limited * predicted.mag[i] + gd * (magnitude + observed_mag) + slack + underflow;
    if (!std::isfinite(predicted.sum[i]) || !std::isfinite(threshold)) continue;  // non-finite operands
    const double diff = std::fabs(observed - predicted.sum[i]);
    const double ratio = std::isfinite(diff) ? diff / threshold : std::numeric_limits<double>::infinity();
    if (ratio > v.ratio || v.index < 0) {
      v.ratio = ratio;
      v.diff = diff;
      v.threshold = threshold;
      v.index = i;
    }
  }
  v.fault = v.ratio > 1.0;
  return v;
}

int64_t locate_in_row(const MatrixView& A, const MatrixView& B, const float* C, int64_t row, const float* bias) {
  const int64_t K = logical_cols(A), N = logical_cols(B);
  auto at = [](const MatrixView& m, int64_t p, int64_t q) {
    return static_cast<double>(m.transposed ? m.data[q * m.cols + p] : m.data[p * m.cols + q]);
  };
  int64_t worst = 0;
  double worst_ratio = -1;
  for (int64_t j = 0; j < N; ++j) {
    double value = bias ? bias[j] : 0.0, mag = bias ? std::fabs(static_cast<double>(bias[j])) : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double t = at(A, row, k) * at(B, k, j);
      value += t;
      mag += std::fabs(t);
    }
    const double off = std::fabs(static_cast<double>(C[row * N + j]) - value);
    const double ratio = std::isfinite(off) ? off / (mag + bounds::kHalfMinSubnormalF32) : std::numeric_limits<double>::infinity();
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = j;
    }
  }
  return worst;
}

}  // namespace lockstep::detect
