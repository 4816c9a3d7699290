// SlidingWindow{left, right}: query i sees keys i - left <= j <= i + right (absolute
// positions). `Causal{} & SlidingWindow{w, 0}` is the usual local attention, and a KV cache
// of W recent tokens (the current one included) is left = W - 1.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct SlidingWindow {
  using slot = MaskSlot;

  // Reach is capped at 2^60 so that i + right never overflows for any valid position
  // (|i| <= 2^62 plus the query count). A larger reach is clamped: a key more than 2^60
  // positions from its query is outside the window even then (only q_offsets beyond 2^60
  // can make such a pair).
  static constexpr Index kMaxReach = Index{1} << 60;

  Index left = 0, right = 0;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<SlidingWindow>().add(left).add(right).value();
  }

  /// Throws Error for a negative reach; reaches above 2^60 are clamped to 2^60 (see above).
  SlidingWindow(Index left_keys, Index right_keys)
      : left(std::min(left_keys, kMaxReach)), right(std::min(right_keys, kMaxReach)) {
    detail::require(left_keys >= 0, "SlidingWindow.left", ">= 0", left_keys);
    detail::require(right_keys >= 0, "SlidingWindow.right", ">= 0", right_keys);
  }

  /// The last `window` keys up to the query's own: i - window < j <= i, with Causal the
  /// window of Hugging Face's and llama.cpp's `sliding_window = window` (Mistral, Gemma 2
  /// and 3, gpt-oss): SlidingWindow{window - 1, 0}. Throws Error unless window >= 1.
  static SlidingWindow last(Index window) {
    detail::require(window >= 1, "SlidingWindow::last(window)", ">= 1", window);
    return SlidingWindow{window - 1, 0};
  }

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    return i - left <= j && j <= i + right;
  }

  /// The keys query i sees: [i - left, i + right].
  KeyRanges<1> runs(Index /*b*/, Index /*h*/, Index i) const {
    return key_range(i - left, i + right + 1);
  }

  /// Keys any query of q may see: [q.begin - left, q.last() + right].
  KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, Range q) const {
    return key_range(q.begin - left, q.last() + right + 1);
  }

  TileKind classify(Index /*b*/, Index /*h*/, Range q, Range kv) const {
    if (kv.last() < q.begin - left || kv.begin > q.last() + right) return TileKind::Empty;
    if (kv.begin >= q.last() - left && kv.last() <= q.begin + right) return TileKind::Full;
    return TileKind::Partial;
  }
};

}  // namespace attnkit
