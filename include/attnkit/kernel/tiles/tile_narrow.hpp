// The narrow path of the tile engine (kernel/tiles/attention_tiles.hpp): a tile of at most
// AttentionTiles::kNarrow queries forms its products row by row -- a dot product per key and
// query, vectorized over the head dimension -- instead of as tile GEMMs, which would fill one
// lane of each GEMM vector. The queries come in rows (kernel/tiles/tile_queries.hpp packs them).
#pragma once

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail::narrow {

// s[nk, lanes] (rows ld apart) = K[k0:k0+nk] . q_r for each query row r of qr [nq, d]
// (padding lanes 0), vectorized over the head dimension: no GEMM lane is wasted when a tile
// holds one to kNarrow queries.
inline void dot_rows(const F32Rows& keys, Index nk, Index nq, Index lanes, const float* qr, Index d,
                     float* s, Index ld) {
  for (Index jj = 0; jj < nk; ++jj) {
    const float* key = keys.data + jj * keys.ld;
    float* row = s + jj * ld;
    for (Index r = 0; r < lanes; ++r) row[r] = 0.f;
    for (Index r = 0; r < nq; ++r) row[r] = simd::dot(key, qr + r * d, d);
  }
}

// acc[nq, dv] (rows dv_pad apart) += P[nq, j0:j1] * values[j0:j1], row by row, with P read
// transposed from s (rows ld apart).
inline void weighted_sum(const float* s, Index ld, const F32Rows& values, Index j0, Index j1,
                         Index nq, Index dv, float* acc_rows, Index dv_pad) {
  const Index whole = dv / simd::kWidth * simd::kWidth;
  for (Index jj = j0; jj < j1; ++jj) {
    const float* value = values.data + jj * values.ld;
    for (Index r = 0; r < nq; ++r) {
      const float w = s[jj * ld + r];
      const simd::Vec wv(w);
      float* acc = acc_rows + r * dv_pad;
      for (Index c = 0; c < whole; c += simd::kWidth)
        simd::store(acc + c, simd::fma(wv, simd::load(value + c), simd::load(acc + c)));
      for (Index c = whole; c < dv; ++c) acc[c] += w * value[c];
    }
  }
}

}  // namespace attnkit::detail::narrow
