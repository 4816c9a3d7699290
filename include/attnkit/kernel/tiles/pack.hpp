// Packing: copies of Q tiles into f32 scratch in the transposed layout the tile GEMMs read
// (scaled, padded lanes zeroed), and the contiguous f32 copy of K and V the tiles read when
// their rows are far apart. Storage rows are converted by storage/f32_rows.hpp.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

inline float row_scale(float scale, Index /*row*/) { return scale; }
inline float row_scale(const float* scales, Index row) { return scales[row]; }

/// Lanes [nq, lanes) of the `dim` rows of qt (ld apart) to 0, before the rows are written.
/// With lanes a whole number of vectors (the tile engine's), the vectors from nq's down to
/// `lanes`, one store each: a std::fill of a few floats a row cost a call per head dim, paid
/// per chunk by decode's one-row tiles. Nothing at or past `lanes` is written.
inline void zero_padding_lanes(float* qt, Index ld, Index dim, Index nq, Index lanes) {
  constexpr Index w = simd::kWidth;
  if (lanes % w != 0) {
    for (Index c = 0; c < dim; ++c) std::fill(qt + c * ld + nq, qt + c * ld + lanes, 0.f);
    return;
  }
  for (Index c = 0; c < dim; ++c)
    for (Index r = nq / w * w; r < lanes; r += w) simd::store(qt + c * ld + r, simd::Vec(0.f));
}

/// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: f32 rows transposed,
/// kWidth x kWidth blocks at a time (simd/transpose.hpp), the edges element by element.
inline void transpose_rows(const float* src, Index ld_src, Index rows, Index cols, float* dst,
                           Index ld_dst) {
  constexpr Index w = simd::kWidth;
  const Index whole_rows = rows / w * w, whole_cols = cols / w * w;
  for (Index r = 0; r < whole_rows; r += w)
    for (Index c = 0; c < whole_cols; c += w)
      simd::transpose_block(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst);
  for (Index c = 0; c < cols; ++c) {
    const Index r0 = c < whole_cols ? whole_rows : 0;  // the edges the blocks left
    for (Index r = r0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
}

/// qt[D, ld] = scale * Q[rows, D]^T for `rows` query rows from (b, h, row0); columns past
/// `rows` up to `padded` are 0, so padded query lanes compute finite, unused logits.
/// `scale` is one float for every row or a pointer to one per row.
template <class T, class Scale>
void pack_q_transposed(const View<T>& q, Index b, Index h, Index row0, Index rows, Index padded,
                       Scale scale, float* qt, Index ld) {
  const Index dim = q.dim;
  zero_padding_lanes(qt, ld, dim, rows, padded);
  if constexpr (is_f32<T>()) {
    // f32 rows: transposed through registers, then scaled in place (a lane of qt per row).
    transpose_rows(q.row(b, h, row0), q.seq_stride, rows, dim, qt, ld);
    constexpr Index w = simd::kWidth;
    const Index whole = rows / w * w;
    for (Index r = 0; r < whole; r += w) {
      simd::Vec f;
      if constexpr (std::is_pointer_v<Scale>)
        f = simd::load(scale + r);
      else
        f = simd::Vec(scale);
      for (Index c = 0; c < dim; ++c) simd::store(qt + c * ld + r, simd::load(qt + c * ld + r) * f);
    }
    for (Index c = 0; c < dim; ++c)
      for (Index r = whole; r < rows; ++r) qt[c * ld + r] *= row_scale(scale, r);
  } else {
    for (Index r = 0; r < rows; ++r) {
      const T* src = q.row(b, h, row0 + r);
      const float f = row_scale(scale, r);
      for (Index c = 0; c < dim; ++c) qt[c * ld + r] = static_cast<float>(src[c]) * f;
    }
  }
}

// The tiles read f32 K and V rows (the backward also Q and dO) in place when they are back
// to back. Rows further apart (BSHD with several heads: H D floats apart; a padded layout)
// cost the tile GEMMs, which read each key tile again for every query tile: on Zen 3 (d 128,
// L 4096, causal, one thread) BSHD ran 12% (H 2) to 22% (H 8) below BHSD, and packing each
// key tile per query tile cost more than it saved (a third of the time in the copy). So with
// at least kContiguousCopyQueries queries (a pass over K and V then costs about 1% of the
// tiles) the call reads them from one contiguous copy [B, Hkv, Lk, D], as a row-turning
// Position's keys.
inline constexpr Index kContiguousCopyQueries = 256;

/// x as a contiguous f32 copy in `copy` when the tiles should read one (see above), else x.
/// The backward's tiles, which read each query tile again for every key tile, gain alike:
/// BSHD H 8 (d 128, L 2048, causal, one thread, Zen 3) from 0.79x of BHSD to 1.0x.
template <class T>
View<T> tile_rows(const View<T>& x, const Problem& p, bool split, std::vector<float>& copy) {
  if constexpr (is_f32<T>()) {
    if (!split && p.q_len >= kContiguousCopyQueries && x.seq_stride != x.dim) {
      copy = contiguous_rows(x, thread_count(p.threads), [](float*, Index, Index, Index) {});
      return bhsd(static_cast<T*>(copy.data()), x.batch, x.heads, x.seq, x.dim);
    }
  }
  return x;
}

}  // namespace attnkit::detail
