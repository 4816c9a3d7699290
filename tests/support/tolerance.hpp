// Tolerance: the allowed error of each value a kernel test compares against the f64
// reference (outputs, LSE, row sums), named after the per-dtype tolerances; Agreement: the
// worst error of one comparison over its allowance, and the rows that see no key.
#pragma once

#include <attnkit/core/tensor.hpp>
#include <limits>
#include <vector>

#include "support/attnkit_test.hpp"

namespace attnkit::test {

/// The allowed error of each compared value. A bound e on each logit's error (logit) adds
/// 8 e per unit of magnitude to an output, e to an LSE and 2 e (Lk + |sum|) to a row sum.
struct Tolerance {
  double out = tol::kF32;     // per unit of magnitude: 1, or max(1, sum_j w_ij |v_j|) (Sigmoid)
  double lse = tol::kLseF32;  // absolute, plus lse_rel |lse|
  double lse_rel = std::numeric_limits<float>::epsilon();  // f32 rounding of the LSE itself
  double sum_rel = tol::kRowSumRel;                        // row sums: of max(1, |sum|)
  double logit = 0.0;
};

/// The worst error over the allowed one (at most 1 passes) and the rows that see no key.
struct Agreement {
  double out = 0.0, stat = 0.0;
  bool padding_intact = true;  // the output's padding (Layout::Padded) still holds NaN
  Index empty_rows = 0;
  bool empty_exact = true;  // each such row 0 in both, with the empty statistic in both
};

struct Case;

/// What agreement() (reference_check.hpp) compares, gathered by its template part: the
/// kernel's output and row statistic and the f64 reference's, per row whether the mask lets it
/// see a key, and per head the statistic an empty row must report. Compared once, here, not
/// per instantiation (support.cpp).
struct ComparedRows {
  const Case& c;
  const Tensor<float>& out;         // [B, Hq, Lq, Dv] in c.layout, NaN where not written
  const Tensor<double>& expected;   // Bhsd
  const Tensor<double>* magnitude;  // unnormalized rules: sum_j w_ij |v_j|; else null
  const std::vector<float>& stat;   // per row; empty when the normalizer has none
  const std::vector<float>& stat_expected;
  bool stat_is_sum;                      // an l1 row sum (relative bound), else an LSE
  const std::vector<char>& sees_a_key;   // per row (b, h, r)
  const std::vector<float>& empty_stat;  // per query head
};
Agreement compare_rows(const ComparedRows& rows, const Tolerance& t);

/// CHECKs an Agreement: out and stat within tolerance, the padding intact, the rows that see
/// no key exact.
void check_agreement(const Agreement& a);

}  // namespace attnkit::test
