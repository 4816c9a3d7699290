// Packing: copies of Q, K and V tiles into f32 scratch in the layouts the tile GEMMs read.
// Storage types (float, Eigen::bfloat16, Eigen::half, the quantized blocks) are converted
// to f32 here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/storage_rows.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/tensor.hpp"

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

/// True for f32 storage, whose rows can feed the tile GEMMs in place (as a GEMM's B
/// operand only when a row is also a whole number of SIMD vectors).
template <class T>
constexpr bool is_f32() {
  return std::is_same_v<std::remove_const_t<T>, float>;
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

/// dst[rows, ld] = f32(src rows from (b, h, row0)), columns past src.dim up to ld are 0.
/// bfloat16 and half rows widen with SIMD, quantized blocks dequantize in registers
/// (detail/storage_rows.hpp).
template <class T>
void pack_rows(const View<T>& src, Index b, Index h, Index row0, Index rows, float* dst, Index ld) {
  for (Index r = 0; r < rows; ++r) {
    float* out = dst + r * ld;
    row_to_f32(src.row(b, h, row0 + r), src.dim, out);
    std::fill(out + src.dim, out + ld, 0.f);
  }
}

/// True for bfloat16 storage, whose rows widen to f32 exactly: bf16 products need no rounding.
template <class T>
constexpr bool is_bf16() {
  return std::is_same_v<std::remove_const_t<T>, Eigen::bfloat16>;
}

/// The f32 rows of an f32 view; nullptr for other storage (never read then).
template <class T>
const float* as_f32(const T* p) {
  if constexpr (is_f32<T>())
    return p;
  else
    return nullptr;
}

/// `rows` f32 rows from (b, h, row0) and their stride: the view's own memory when it can
/// serve in place, else a copy into `scratch` with stride `ld` (converted, zero-padded).
struct F32Rows {
  const float* data;
  Index ld;
};
template <class T>
F32Rows f32_rows(const View<T>& src, bool in_place, Index b, Index h, Index row0, Index rows,
                 float* scratch, Index ld) {
  if (in_place) return {as_f32(src.row(b, h, row0)), src.seq_stride};
  pack_rows(src, b, h, row0, rows, scratch, ld);
  return {scratch, ld};
}

/// x's rows in f32, BHSD-contiguous [B, H, S, D], each then handed to turn(row, b, h, s);
/// rows are shared out over `threads`, 64 at a time.
template <class T, class Turn>
std::vector<float> contiguous_rows(const View<T>& x, int threads, Turn&& turn) {
  std::vector<float> out(static_cast<std::size_t>(x.batch * x.heads * x.seq * x.dim));
  parallel_for(threads, x.batch * x.heads * x.seq, 64, [&](Index row) {
    const Index s = row % x.seq, bh = row / x.seq;
    const Index b = bh / x.heads, h = bh % x.heads;
    float* dst = out.data() + row * x.dim;
    row_to_f32(x.row(b, h, s), x.dim, dst);
    turn(dst, b, h, s);
  });
  return out;
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
