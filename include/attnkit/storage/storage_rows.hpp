// Rows of any K/V storage type read as f32 and written from f32: float, Eigen::bfloat16 and
// Eigen::half element by element (or widened with SIMD), the quantized blocks of
// storage/blocks.hpp block by block. Everything that reads a K or V row whole (the tile
// packing, the key transforms of positions, cosine norms, the reference) or one vector at a
// column (the decode engine) goes through these, so each storage type is written once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/simd/int_widen.hpp"
#include "attnkit/simd/vec.hpp"
#include "attnkit/storage/quantize.hpp"

namespace Eigen {  // the storage types, declared here so this header needs no Eigen include
struct bfloat16;
struct half;
}  // namespace Eigen

namespace attnkit::detail {

/// The storage types attention() reads and writes.
template <class T>
constexpr bool is_storage() {
  using U = std::remove_const_t<T>;
  return std::is_same_v<U, float> || std::is_same_v<U, Eigen::bfloat16> ||
         std::is_same_v<U, Eigen::half>;
}

/// The storage types K and V may have in attention(), decode() and the caches: those, and
/// the quantized blocks.
template <class T>
constexpr bool is_kv_storage() {
  return is_storage<T>() || is_block_quantized<T>();
}

/// Value c of a row, as f32.
template <class T>
float value_at(const T* row, Index c) {
  if constexpr (is_block_quantized<T>())
    return block_value(row[c / kQuantBlock], c % kQuantBlock);
  else
    return static_cast<float>(row[c]);
}

/// The integers of a block's values [off, off + kWidth) (off a multiple of kWidth), as floats:
/// the values divided by the block's scale.
inline simd::Vec block_ints(const BlockQ8_0& blk, Index off) { return simd::load_i8(blk.qs + off); }
inline simd::Vec block_ints(const BlockQ4_0& blk, Index off) {
  constexpr Index kHalf = kQuantBlock / 2;  // values 16..31 are the high nibbles of bytes 0..15
  return simd::load_u4(blk.qs + off % kHalf, off >= kHalf);
}

/// A block's scale.
template <class Block>
float block_scale(const Block& blk) {
  return simd::half_to_float(blk.d);
}

/// Values [off, off + kWidth) of a block (off a multiple of kWidth), dequantized in registers.
template <class Block>
simd::Vec block_vector(const Block& blk, Index off) {
  return block_ints(blk, off) * simd::Vec(block_scale(blk));
}

/// out[0, dim) = the row's values in f32 (bf16 and f16 widened with SIMD where it can).
template <class T>
void row_to_f32(const T* row, Index dim, float* out) {
  using U = std::remove_const_t<T>;
  if constexpr (is_block_quantized<T>()) {
    for (Index b = 0; b < dim / kQuantBlock; ++b)
      for (Index off = 0; off < kQuantBlock; off += simd::kWidth)
        simd::store(out + b * kQuantBlock + off, block_vector(row[b], off));
  } else if constexpr (std::is_same_v<U, Eigen::bfloat16>) {
    simd::widen_bf16(reinterpret_cast<const std::uint16_t*>(row), out, dim);
  } else if constexpr (std::is_same_v<U, Eigen::half>) {
    if (!simd::widen_f16(reinterpret_cast<const std::uint16_t*>(row), out, dim))
      for (Index c = 0; c < dim; ++c) out[c] = static_cast<float>(row[c]);
  } else {
    for (Index c = 0; c < dim; ++c) out[c] = static_cast<float>(row[c]);
  }
}

/// kWidth f32 values from storage T at p, widened in registers (no store on the way).
template <class T>
simd::Vec widened(const T* p) {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return simd::in_register(simd::load(p));  // one load, shared by the rows that use it
  } else if constexpr (std::is_same_v<U, Eigen::bfloat16>) {
    return simd::load_bf16(reinterpret_cast<const std::uint16_t*>(p));
  } else if constexpr (simd::kWidensF16) {
    return simd::load_f16(reinterpret_cast<const std::uint16_t*>(p));
  } else {
    alignas(64) float out[simd::kWidth];
    for (int i = 0; i < simd::kWidth; ++i) out[i] = static_cast<float>(p[i]);
    return simd::load(out);
  }
}

/// kWidth f32 values of a row of storage T from column c (a multiple of kWidth): widened(),
/// or dequantized in registers for the quantized blocks.
template <class T>
simd::Vec widened_at(const T* row, Index c) {
  if constexpr (is_block_quantized<T>())
    return block_vector(row[c / kQuantBlock], c % kQuantBlock);
  else
    return widened(row + c);
}

/// dst row = the dim values at src rounded to T (blocks: quantized; src finite, dim a multiple
/// of 32: the callers check both).
template <class T>
void row_from_f32(const float* src, Index dim, T* dst) {
  if constexpr (is_block_quantized<T>()) {
    for (Index b = 0; b < dim / kQuantBlock; ++b) encode_block(src + b * kQuantBlock, dst[b]);
  } else {
    for (Index c = 0; c < dim; ++c) dst[c] = static_cast<T>(src[c]);
  }
}

}  // namespace attnkit::detail
