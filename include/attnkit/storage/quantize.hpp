// Rows of f32 values to and from the GGUF blocks of storage/blocks.hpp, bit for bit as
// llama.cpp's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) write them,
// so caches move between the two:
//   q8_0: d = max|x| / 127, q = round(x / d) (halves away from 0), d stored as a half;
//   q4_0: m = the value of largest magnitude, d = m / -8, q = min(15, trunc(x / d + 8.5)),
//         d stored as a half (value j and j + 16 share byte j: low and high nibble).
// Decoding multiplies by the stored (half) d. A block of zeros has d = 0 (q4_0: -0, from
// 0 / -8) and decodes to 0; so does a block too small for d to be a normal float's inverse.
// Values with no encoding -- not finite, or large enough that d overflows the half, max |x|
// >= 8321040 (q8_0) or 524160 (q4_0) -- make quantize_row() throw Error before it writes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attnkit/core/error.hpp"
#include "attnkit/core/half_bits.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/storage/blocks.hpp"

namespace attnkit {
namespace detail {

// 1 / d, or 0 for d = 0 and for a d so small that 1 / d overflows (x * inf would be out of
// the integers' range; such a block's half scale is 0 and it decodes to 0 either way).
inline float inverse_or_zero(float d) {
  const float id = d != 0.f ? 1.f / d : 0.f;
  return std::isfinite(id) ? id : 0.f;
}

/// The largest |x| a block can encode (BlockFormat, storage/blocks.hpp: d = |x| / 127 for
/// q8_0, / 8 for q4_0, below 65520, which rounds to the half's infinity).
template <class Block>
constexpr float max_encodable() {
  return BlockFormat<std::remove_const_t<Block>>::kMaxEncodable;
}

/// The index of the first value of x[0, n) that Block cannot encode (not finite, or |x| at
/// or above max_encodable()), or -1.
template <class Block>
Index first_unencodable(const float* x, Index n) {
  for (Index j = 0; j < n; ++j)
    if (!(std::fabs(x[j]) < max_encodable<Block>())) return j;  // NaN fails the compare too
  return -1;
}

inline void encode_block(const float* x, BlockQ8_0& out) {
  float amax = 0.f;
  for (Index j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f, id = inverse_or_zero(d);
  out.d = float_to_half_bits(d);
  for (Index j = 0; j < kQuantBlock; ++j)
    out.qs[j] = static_cast<std::int8_t>(std::round(x[j] * id));
}

inline void encode_block(const float* x, BlockQ4_0& out) {
  float amax = 0.f, extreme = 0.f;  // the value of largest magnitude, its sign kept
  for (Index j = 0; j < kQuantBlock; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  const float d = extreme / -8.f, id = inverse_or_zero(d);
  out.d = float_to_half_bits(d);
  const auto nibble = [id](float v) {  // truncated toward 0, as llama.cpp's (int8_t) cast
    float scaled = v * id;
    // Rounded before the add, as the C source reads: an FMA the compiler contracted would
    // round once and, now and then, land on the other side of an integer.
    asm("" : "+m"(scaled));
    return static_cast<std::uint8_t>(std::min(15, static_cast<int>(scaled + 8.5f)));
  };
  for (Index j = 0; j < kQuantBlock / 2; ++j)
    out.qs[j] = static_cast<std::uint8_t>(nibble(x[j]) | (nibble(x[j + kQuantBlock / 2]) << 4));
}

/// Value j (< 32) of a block.
inline float block_value(const BlockQ8_0& blk, Index j) {
  return static_cast<float>(blk.qs[j]) * half_bits_to_float(blk.d);
}
inline float block_value(const BlockQ4_0& blk, Index j) {
  const int q = j < kQuantBlock / 2 ? blk.qs[j] & 15 : blk.qs[j - kQuantBlock / 2] >> 4;
  return static_cast<float>(q - 8) * half_bits_to_float(blk.d);
}

/// Throws Error unless n is a multiple of the block size, and not negative.
inline void require_whole_blocks(const char* what, Index n) {
  require(n >= 0 && n % kQuantBlock == 0, what,
          cat("a multiple of ", kQuantBlock, " (quantized blocks), >= 0"), n);
}

}  // namespace detail

/// out[0, n / 32) = x[0, n) in blocks of 32. Throws Error when n is negative or not a multiple of
/// 32 or some x has no encoding (nothing is written then).
template <class Block>
void quantize_row(const float* x, Index n, Block* out) {
  static_assert(detail::is_block_quantized<Block>(), "quantize_row(): BlockQ8_0 or BlockQ4_0");
  detail::require_whole_blocks("quantize_row(): n", n);
  const Index bad = detail::first_unencodable<Block>(x, n);
  if (bad >= 0)
    detail::fail(detail::cat("quantize_row(): x[", bad, "]"),
                 detail::cat("a finite value of magnitude below ", detail::max_encodable<Block>()),
                 std::to_string(x[bad]));
  for (Index b = 0; b < n / detail::kQuantBlock; ++b)
    detail::encode_block(x + b * detail::kQuantBlock, out[b]);
}

/// out[0, n) = the values of blocks in[0, n / 32). Throws Error when n is not a multiple of 32.
template <class Block>
void dequantize_row(const Block* in, Index n, float* out) {
  static_assert(detail::is_block_quantized<std::remove_const_t<Block>>(),
                "dequantize_row(): BlockQ8_0 or BlockQ4_0");
  detail::require_whole_blocks("dequantize_row(): n", n);
  for (Index j = 0; j < n; ++j)
    out[j] = detail::block_value(in[j / detail::kQuantBlock], j % detail::kQuantBlock);
}

}  // namespace attnkit
