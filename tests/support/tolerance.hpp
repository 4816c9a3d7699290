// Tolerance: the allowed error of each value a kernel test compares against the f64
// reference (outputs, LSE, row sums), named after the per-dtype tolerances; Agreement: the
// worst error of one comparison over its allowance, and the rows that see no key.
#pragma once

#include <attnkit/tensor.hpp>
#include <limits>

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

/// CHECKs an Agreement: out and stat within tolerance, the padding intact, the rows that see
/// no key exact.
void check_agreement(const Agreement& a);

}  // namespace attnkit::test
