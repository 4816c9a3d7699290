// Decode's Products::Int8 logits (options.hpp): with q8_0 or q4_0 K, the row engine
// (kernel/decode/decode_rows.hpp) quantizes each query row -- scaled and position-turned -- to int8
// per block of 32 once per call (simd/int8_dot.hpp has the rule: q8_0's, with an f32 scale)
// and forms a block's logits with integer dot products on the keys' own bytes, the convention
// of ggml's and ik_llama.cpp's quantized K.Q. The softmax, the weights and P.V stay f32 (V's
// integers are widened to f32 exactly: no cheaper exact form multiplies f32 weights by them).
//
// What it changes: a logit differs from the exact one by the query's rounding only,
//   |s - s_exact| <= sum over blocks b of (max|q_b| / 254) * sum_{c in b} |k_c|
// (q the scaled, turned query row, k the key row as stored), and is exactly the exact logit of
// the query as quantized, up to f32 summation order.
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/prefetch.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/blocks.hpp"

namespace attnkit::detail {

/// True where Products::Int8 changes decode: K rows of quantized blocks.
template <class K>
constexpr bool int8_logits_apply() {
  return is_block_quantized<K>();
}

/// The query rows of one item quantized, and the logits of key rows of block type K with them.
/// (Instantiated for every K storage; engaged only for the blocks: int8_logits_for().)
template <class K>
class Int8Logits {
 public:
  static constexpr simd::KeyBlocks kLayout =
      std::is_same_v<std::remove_const_t<K>, BlockQ8_0> ? simd::KeyBlocks::Q8 : simd::KeyBlocks::Q4;
  static constexpr Index kW = simd::kWidth;

  explicit Int8Logits(Index head_dim) : blocks_(head_dim / kQuantBlock) {}

  /// Bytes of one quantized query row (a multiple of 64).
  Index query_bytes() const { return simd::int8_query_bytes<kLayout>(blocks_); }

  /// out (64-byte aligned, query_bytes() long) = the f32 query row quantized.
  void quantize(const float* row, std::byte* out) const {
    simd::int8_query<kLayout>(row, blocks_, out);
  }

  /// out rows 0 .. R - 1 (out_stride apart) = the nk key rows at `keys` (ld blocks apart) .
  /// the R quantized query rows at q (query_bytes() apart), keys in the lanes as the exact
  /// logits: kW keys' per-lane sums, then one transposing add per row. Each key row read asks
  /// for the one `ahead` on.
  template <int R>
  void logits(const std::byte* q, const K* keys, Index ld, Index nk, float* out, Index out_stride,
              const RowsAhead& ahead) const {
    const std::byte* rows[std::size_t{R}];
    for (int x = 0; x < R; ++x) rows[x] = q + x * query_bytes();
    Index j = 0;
    for (; j + kW <= nk; j += kW) {
      simd::Vec part[std::size_t{R}][std::size_t{kW}];  // [row, key] the lanes of a product
      for (Index t = 0; t < kW; ++t) {
        simd::Vec a[std::size_t{R}];
        key_dot<R>(keys + (j + t) * ld, rows, a, ahead);
        for (int x = 0; x < R; ++x) part[x][t] = a[x];
      }
      for (int x = 0; x < R; ++x)
        simd::store(out + x * out_stride + j, simd::transpose_add(part[x]));
    }
    for (; j < nk; ++j) {
      simd::Vec a[std::size_t{R}];
      key_dot<R>(keys + j * ld, rows, a, ahead);
      for (int x = 0; x < R; ++x) out[x * out_stride + j] = simd::reduce_add(a[x]);
    }
  }

 private:
  template <int R>
  void key_dot(const K* key, const std::byte* const* rows, simd::Vec* a,
               const RowsAhead& ahead) const {
    ahead.ask_key(key);
    for (int x = 0; x < R; ++x) a[x] = simd::Vec(0.f);
    simd::int8_key_dot<kLayout, R>(reinterpret_cast<const std::uint8_t*>(key), blocks_, rows, a);
  }

  Index blocks_;  // blocks of 32 values a row
};

/// The int8 logits a call's row engine takes: for Products::Int8 over quantized K, else none.
template <class K>
std::optional<Int8Logits<K>> int8_logits_for(const Problem& p) {
  if (int8_logits_apply<K>() && p.products == Products::Int8) return Int8Logits<K>(p.head_dim);
  return std::nullopt;
}

}  // namespace attnkit::detail
