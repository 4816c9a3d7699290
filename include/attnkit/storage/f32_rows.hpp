// f32 rows of any storage: the rows of a View<T> (float, Eigen::bfloat16, Eigen::half, the
// quantized blocks) converted to f32 rows (storage/storage_rows.hpp's row_to_f32), in place
// where f32 rows can serve, else copied; and a whole view as a contiguous f32 copy.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

/// True for f32 storage, whose rows can feed the tile GEMMs in place (as a GEMM's B
/// operand only when a row is also a whole number of SIMD vectors).
template <class T>
constexpr bool is_f32() {
  return std::is_same_v<std::remove_const_t<T>, float>;
}

/// dst[rows, ld] = f32(src rows from (b, h, row0)), columns past src.dim up to ld are 0.
/// bfloat16 and half rows widen with SIMD, quantized blocks dequantize in registers
/// (storage/storage_rows.hpp).
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

}  // namespace attnkit::detail
