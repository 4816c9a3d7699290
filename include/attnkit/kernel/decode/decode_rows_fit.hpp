// Which calls the decode row engine (kernel/decode/decode_rows.hpp) runs: the specs it can take
// (decode_rows_fit()) and the query rows per head up to which it is faster than query tiles
// (kDecodeRowsMaxQueries). split-KV (kernel/split_kv.hpp), attention() and paged decode ask.
#pragma once

#include <type_traits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/score/faces.hpp"

namespace attnkit::detail {

/// Query rows per head up to which split-KV runs the row engine rather than query tiles:
/// each row costs the engine the same, while a tile's products fill more SIMD lanes as rows
/// grow. Measured (Lk 4096, H 32, d 128, 1 thread, AVX-512): the engine is 1.2 to 10x faster
/// at Lq 1 to 4, and 1.2 to 1.5x slower at Lq 16; with four rows of a KV group sharing each
/// load, at Lq 8 too (Lk 8192, Hkv 8, causal: f32 25-37 -> 17 ms on 1 thread, 14-16 -> 10 on
/// 2; bf16 26 -> 16-18, 13 -> 8.4-9.1; q8_0 26-32 -> 22-29, 13-15 -> 12-13), so up to 8.
inline constexpr Index kDecodeRowsMaxQueries = 8;

/// True when DecodeRows can run the spec: softmax rows (the engine writes softmax's online
/// rescale itself; sinks are added by the merge), a logit mod that does not read positions
/// (none, Softcap, a Score with kReadsPositions = false: its tiles hold keys in lanes), no Position
/// or one that turns rows (the key rows then arrive turned), and a mask without gathered columns
/// (AttentionTiles reads only their rows). Others take AttentionTiles.
template <class Spec>
constexpr bool decode_rows_fit() {
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  return std::is_same_v<typename Spec::Normalizer, Softmax> && !reads_positions<Score>() &&
         (std::is_same_v<Position, NoPosition> || transforms_rows<Position>()) &&
         !has_columns<typename Spec::Mask>::value;
}

}  // namespace attnkit::detail
