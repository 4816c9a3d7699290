// Block-quantized K/V storage in GGUF's layouts, so that a llama.cpp-style cache is read in
// place: BlockQ8_0 (32 int8 values and one half scale: 8.5 bits a value) and BlockQ4_0 (32
// 4-bit values and one half scale: 4.5 bits a value). A View over blocks counts its row
// length (dim) in values, a multiple of 32, and its strides in blocks; bhsd() and bshd() build
// them as for any storage. K and V may each be quantized independently (attention(), decode(),
// KvCache, PagedKv and the paged and varlen calls read them; queries and outputs stay f32,
// bf16 or f16). storage/quantize.hpp encodes and decodes rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attnkit/core/tensor.hpp"

namespace attnkit {

/// 32 values qs[j] * d. GGUF's block_q8_0: d an IEEE half (its bits), 34 bytes.
struct BlockQ8_0 {
  static constexpr std::ptrdiff_t kBlockValues = 32;  // values a block holds (core/tensor.hpp)
  std::uint16_t d;
  std::int8_t qs[32];
};

/// 32 values: value j < 16 is ((qs[j] & 15) - 8) * d, value j + 16 is ((qs[j] >> 4) - 8) * d.
/// GGUF's block_q4_0: d an IEEE half (its bits), 18 bytes.
struct BlockQ4_0 {
  static constexpr std::ptrdiff_t kBlockValues = 32;
  std::uint16_t d;
  std::uint8_t qs[16];
};

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18,
              "GGUF's block layouts are packed: no padding");

namespace detail {

/// Values per quantized block.
inline constexpr std::ptrdiff_t kQuantBlock = 32;

/// What a block format says of itself, one specialization per format (its values per block
/// are the block's own kBlockValues): the |x| it encodes (its scale d = max|x| / kLevels must stay
/// below 65520, where the half rounds to infinity). A format without one is a compile error where
/// it is asked.
template <class Block>
struct BlockFormat;
template <>
struct BlockFormat<BlockQ8_0> {
  static constexpr float kLevels = 127.f;  // d = max|x| / 127
  static constexpr float kMaxEncodable = 65520.f * kLevels;
};
template <>
struct BlockFormat<BlockQ4_0> {
  static constexpr float kLevels = 8.f;  // d = the extreme value / -8
  static constexpr float kMaxEncodable = 65520.f * kLevels;
};
static_assert(BlockQ8_0::kBlockValues == kQuantBlock && BlockQ4_0::kBlockValues == kQuantBlock,
              "the kernels read blocks of kQuantBlock values");

}  // namespace detail
}  // namespace attnkit
