// SelectedRows: the rows a top-k selection names, as a table of f32 row pointers for the
// tile GEMM's row operands (gemm::RowsA, gemm::RowsB): f32 rows in place, never copied;
// other storage (bf16, f16, quantized) widened once into scratch rows. The DSA engines
// (dsa/topk_softmax.hpp, dsa/topk_backward.hpp) multiply by the selected keys and values
// where they lie.
#pragma once

#include <cstddef>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

class SelectedRows {
 public:
  /// Rows keys[0, n) of head g (batch b) of x. `whole` asks for rows readable to
  /// round_up(x.dim) columns, zero past x.dim (a row operand of B): f32 rows serve in place
  /// when x.dim is a whole number of vectors, else they are widened too.
  template <class T>
  void take(const View<T>& x, Index b, Index g, const Index* keys, Index n, bool whole) {
    const Index ld = simd::round_up(x.dim);
    rows_.resize(std::size_t(n));
    if (is_f32<T>() && (!whole || x.dim == ld)) {
      for (Index j = 0; j < n; ++j) rows_[std::size_t(j)] = as_f32(x.row(b, g, keys[j]));
      return;
    }
    if (scratch_.size() < std::size_t(n * ld)) scratch_.resize(std::size_t(n * ld));
    for (Index j = 0; j < n; ++j) {
      float* row = scratch_.data() + j * ld;
      pack_rows(x, b, g, keys[j], 1, row, ld);
      rows_[std::size_t(j)] = row;
    }
  }

  /// The table: row j's f32 values at rows()[j].
  const float* const* rows() const { return rows_.data(); }

 private:
  std::vector<const float*> rows_;
  std::vector<float> scratch_;
};

}  // namespace attnkit::detail
