// Block-quantized K/V storage in GGUF's layouts, so that a llama.cpp-style cache is read in
// place: BlockQ8_0 (32 int8 values and one half scale: 8.5 bits a value) and BlockQ4_0 (32
// 4-bit values and one half scale: 4.5 bits a value). A View over blocks counts its row
// length (dim) in values, a multiple of 32, and its strides in blocks; bhsd() and bshd() build
// them as for any storage. K and V may each be quantized independently (attention(), decode(),
// KvCache, PagedKv and the paged and varlen calls read them; queries and outputs stay f32,
// bf16 or f16). quant/quantize.hpp encodes and decodes rows.
#pragma once

#include <cstdint>
#include <type_traits>

namespace attnkit {

/// 32 values qs[j] * d. GGUF's block_q8_0: d an IEEE half (its bits), 34 bytes.
struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[32];
};

/// 32 values: value j < 16 is ((qs[j] & 15) - 8) * d, value j + 16 is ((qs[j] >> 4) - 8) * d.
/// GGUF's block_q4_0: d an IEEE half (its bits), 18 bytes.
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[16];
};

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18,
              "GGUF's block layouts are packed: no padding");

namespace detail {

/// Values per quantized block.
inline constexpr std::ptrdiff_t kQuantBlock = 32;

/// True for the block types (const or not).
template <class T>
constexpr bool is_block_quantized() {
  using U = std::remove_const_t<T>;
  return std::is_same_v<U, BlockQ8_0> || std::is_same_v<U, BlockQ4_0>;
}

/// Values one storage element holds: 32 for a block, 1 otherwise.
template <class T>
constexpr std::ptrdiff_t values_per_element() {
  return is_block_quantized<T>() ? kQuantBlock : 1;
}

/// What a block format says of itself, one specialization per format: values per block and
/// the largest |x| it encodes (its scale d = max|x| / kLevels must stay below 65520, where
/// the half rounds to infinity). A format without one is a compile error where it is asked.
template <class Block>
struct BlockFormat;
template <>
struct BlockFormat<BlockQ8_0> {
  static constexpr std::ptrdiff_t kValues = 32;
  static constexpr float kLevels = 127.f;  // d = max|x| / 127
  static constexpr float kMaxEncodable = 65520.f * kLevels;
};
template <>
struct BlockFormat<BlockQ4_0> {
  static constexpr std::ptrdiff_t kValues = 32;
  static constexpr float kLevels = 8.f;  // d = the extreme value / -8
  static constexpr float kMaxEncodable = 65520.f * kLevels;
};
static_assert(BlockFormat<BlockQ8_0>::kValues == kQuantBlock &&
                  BlockFormat<BlockQ4_0>::kValues == kQuantBlock,
              "the kernels read blocks of kQuantBlock values");

/// Storage elements of a row of `dim` values (dim a multiple of 32 for blocks).
template <class T>
constexpr std::ptrdiff_t row_elements(std::ptrdiff_t dim) {
  return dim / values_per_element<T>();
}

}  // namespace detail
}  // namespace attnkit
