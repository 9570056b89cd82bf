// Algorithm-based fault tolerance for one matrix product C (M×N) [+]= A (M×K)·B (K×N): its row
// and column checksums against the ones the operands predict,
//
//   Σ_j C[i,j] = Σ_k A[i,k]·(Σ_j B[k,j])        Σ_i C[i,j] = Σ_k (Σ_i A[i,k])·B[k,j],
//
// each held to a threshold derived from the operands (NUMERICS.md, "ABFT facts"), never a fixed ε:
// every element of a product of K terms carries at most γ_L·Σ_k |A[i,k]||B[k,j]| of rounding (L the
// longest chain of roundings: min(K, 64) + 2 for canonical mode's chunked chains, their exact
// combination and the epilogue; K + 1 for fast mode's GEMM in any order onto its initial C), so a
// row checksum's threshold is γ_L·Σ_k |A[i,k]|·(Σ_j |B[k,j]|) (+ the terms the epilogue adds: a
// bias, the C the product accumulates onto), plus the error of the checksums themselves (computed
// in double: γ of their lengths in double, and the underflow of every fp32 rounding). A fault in
// one element of C moves its row's checksum (and its column's, which is not computed: the row
// alone detects, and recomputing the failed row of the product locates the element).
//
// Cost: the row checksums read each operand and C once (twice where C accumulates: before and
// after), mostly along rows — O(MK + KN + MN) reads against the product's 2·M·N·K flops. Sums are
// taken in double, rows in parallel (OpenMP) and the column sums of an operand over tiles of rows
// combined in tile order, so that every figure depends on the shapes alone, not on the threads.
// Not here: which products are checked and what a failed check becomes (abft.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/exact_sum.hpp"

namespace lockstep::detect {

// An operand as stored: a row-major rows × cols fp32 matrix, used as itself or as its transpose.
struct MatrixView {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
  bool transposed = false;
};

// The product as stored: row-major M × N, fp32 or, in canonical mode, exact sums (the element
// (i, j) at exact->offset + i·N + j).
struct ProductView {
  float* f32 = nullptr;
  ExactAccumulator* exact = nullptr;
  int64_t offset = 0;
  int64_t M = 0, N = 0;
};

// A checksum vector, its magnitudes and the error of reading it. Observed (of C): sum[i] = Σ_j
// C[i,j], mag[i] = Σ_j |C[i,j]|, slack[i] = error of reading exact sums that had spilled.
// Predicted (from A and B): sum[i] = Σ_k A[i,k]·(Σ_j B[k,j]), mag[i] = Σ_k |A[i,k]|·(Σ_j |B[k,j]|),
// slack empty.
struct ChecksumVector {
  std::vector<double> sum, mag, slack;
};

// Scratch a checker reuses from product to product (no allocation once the largest has been seen).
struct ChecksumScratch {
  std::vector<double> v, v_abs, partial;
  ChecksumVector before, after, predicted, predicted2;
};

// The row checksums of C; magnitudes false: the sums alone (mag left empty), for a C whose
// magnitudes follow from the predicted ones (judge_checksums).
void observed_checksums(const ProductView& c, ChecksumVector& out, bool magnitudes = true);

// Row sums Σ_q X[p,q] (and Σ_q |X[p,q]|) of a logical operand: the b = B·e of a row checksum.
void operand_row_sums(const MatrixView& m, ChecksumScratch& s, std::vector<double>& sum, std::vector<double>& mag);

// The row checksums A·b of a product whose b = B·e (and |B|·e) is known.
void predicted_rows_from(const MatrixView& A, const double* b, const double* b_mag, ChecksumScratch& s,
                         ChecksumVector& out);

// What a linear layer's forward learns of its operands that its backward checks reuse.
struct OperandRowSums {
  std::vector<double> a, a_mag;  // Σ_k A[i,k]: the forward's input, the weight gradient's B·e
  std::vector<double> w, w_mag;  // Σ_k W[j,k]: the input gradient's B·e
};

// The row checksums of A (M×K) · Wᵀ (W stored N×K), one pass over each, and their row sums.
void predicted_rows_times_transposed(const float* A, int64_t M, int64_t K, const float* W, int64_t N,
                                     ChecksumScratch& s, ChecksumVector& out, OperandRowSums& sums);

// The row checksums of two products that share their A (M×K, stored): A·B1 (from b1 = B1·e) and
// Aᵀ·B2 (from b2 = B2·e) — a linear layer's dout·W and doutᵀ·inp — in one pass over A.
void predicted_rows_sharing_a(const float* A, int64_t M, int64_t K, const double* b1, const double* b1_mag,
                              const double* b2, const double* b2_mag, ChecksumScratch& s, ChecksumVector& out1,
                              ChecksumVector& out2);

// How the product was computed, for its threshold.
struct ProductRounding {
  int64_t K = 0;                  // terms per element
  int64_t chain = 0;              // L: roundings along the longest chain of an element (see the top)
  bool before_in_chain = false;   // C += A·B rounded onto C's value before (fast mode), not exactly
  double limited = 0;             // relative error of a limited accumulator, beyond the chain's
};

// L for a product of K terms computed in `canonical` mode (onto an initial C or a bias: `onto`).
int64_t rounding_chain(bool canonical, int64_t K, bool onto);

// The worst checksum of one direction, as |observed − predicted| against its threshold.
struct ChecksumVerdict {
  bool fault = false;     // a checksum exceeds its threshold (or is non-finite where the prediction is not)
  double ratio = 0;       // the largest |observed − predicted| / threshold
  double diff = 0, threshold = 0;  // of that checksum
  int64_t index = -1;     // its row (or column)
};

// Judges observed against predicted checksums of `length` elements each (N for rows, M for
// columns). Where the product accumulates, `before` holds C's before it (observed = after −
// before, and |C before| joins the threshold's magnitudes where it is in the chain). extra: the
// magnitudes the epilogue adds per checksum (a bias: Σ_j |bias_j| per row, M·|bias_j| per column),
// or empty.
ChecksumVerdict judge_checksums(const ChecksumVector& after, const ChecksumVector* before,
                                const ChecksumVector& predicted, int64_t length, const ProductRounding& rounding,
                                const std::vector<double>& extra);

// The column of row `row` of C = A·B (+ bias) that strays furthest from the product recomputed in
// double, relative to its element's magnitude Σ_k |A[row,k]||B[k,j]| (+ |bias_j|): where a failed
// row checksum's fault lies, for a product that overwrites C (one row of the product: K·N work).
int64_t locate_in_row(const MatrixView& A, const MatrixView& B, const float* C, int64_t row, const float* bias);

}  // namespace lockstep::detect
