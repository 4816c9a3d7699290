// Packing: copies of Q, K and V tiles into f32 scratch in the layouts the tile GEMMs read.
// Storage types (float, Eigen::bfloat16, Eigen::half, the quantized blocks) are converted
// to f32 here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attnkit/detail/storage_rows.hpp"
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

}  // namespace attnkit::detail
