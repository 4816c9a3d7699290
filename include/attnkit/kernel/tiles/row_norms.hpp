// Inverse Euclidean norms of rows, for cosine logits (SoftplusL1): a row's cosine with
// another is (q . k) * (1/|q|) * (1/|k|). A zero row has inverse norm 0, so its cosines are
// 0; a row holding NaN or inf gives NaN or 0, and its logits NaN (0 * inf) or NaN.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

/// 1 / |x| for x = row[0 .. dim), or 0 when |x| is 0. Accumulated in double: exact enough
/// for every storage type, and cheap next to the attention it feeds.
template <class T>
float inverse_norm(const T* row, Index dim) {
  double sum = 0.0;
  for (Index c = 0; c < dim; ++c) {
    const auto x = static_cast<double>(value_at(row, c));
    sum += x * x;
  }
  return sum == 0.0 ? 0.f : static_cast<float>(1.0 / std::sqrt(sum));
}

/// inverse_norm() of every row of v, indexed [(b * heads + h) * seq + s].
template <class T>
std::vector<float> inverse_row_norms(const View<T>& v) {
  std::vector<float> out(static_cast<std::size_t>(v.batch * v.heads * v.seq));
  for (Index b = 0; b < v.batch; ++b)
    for (Index h = 0; h < v.heads; ++h)
      for (Index s = 0; s < v.seq; ++s)
        out[static_cast<std::size_t>((b * v.heads + h) * v.seq + s)] =
            inverse_norm(v.row(b, h, s), v.dim);
  return out;
}

}  // namespace attnkit::detail
