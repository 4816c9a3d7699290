// The output side of the tile engine (kernel/tiles/attention_tiles.hpp): each row's finalize factor
// from its normalizer state (one state per kWidth rows, a lane per row), the row statistics
// (log-sum-exp or row sum) copied out for the valid rows, and the output rows acc * factor
// written in the output view's storage type.
#pragma once

#include <algorithm>

#include "attnkit/core/tensor.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

// factor[0, lanes) = each row's finalize factor, as the normalizer gives it.
template <class Normalizer, class State>
void finalize_factors(const Normalizer& normalizer, const State* states, Index lanes,
                      float* factor) {
  for (Index c = 0; c < lanes; c += simd::kWidth)
    simd::store(factor + c, normalizer.finalize(states[c / simd::kWidth]));
}

// at[0, min(valid, kWidth)) = the statistics of one state's rows.
template <class Normalizer, class State>
void store_row_stat(const Normalizer& normalizer, const State& st, float* at, Index valid) {
  alignas(64) float lanes[simd::kWidth];
  if constexpr (row_stat_kind<Normalizer>() != RowStat::None)  // attention() refuses a buffer
    simd::store(lanes, row_stat(normalizer, st));
  else
    return;
  std::copy(lanes, lanes + std::min<Index>(valid, simd::kWidth), at);
}

// stat[0, nq) = the rows' statistics.
template <class Normalizer, class State>
void store_row_stats(const Normalizer& normalizer, const State* states, float* stat, Index nq,
                     Index lanes) {
  for (Index c = 0; c < lanes; c += simd::kWidth)
    store_row_stat(normalizer, states[c / simd::kWidth], stat + c, nq - c);
}

// Rows q0 .. q0 + nq - 1 of head h in batch b of o [.., dv] = acc rows (dv_pad apart) * factor.
template <class O>
void write_rows(const float* acc_rows, Index dv_pad, const float* factor, const View<O>& o, Index b,
                Index h, Index q0, Index nq, Index dv) {
  for (Index r = 0; r < nq; ++r) {
    const float* acc = acc_rows + r * dv_pad;
    O* out = o.row(b, h, q0 + r);
    for (Index c = 0; c < dv; ++c) out[c] = static_cast<O>(acc[c] * factor[r]);
  }
}

}  // namespace attnkit::detail
