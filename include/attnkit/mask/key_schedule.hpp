// The key loop of one query tile: which key tiles the kernel visits, in key order, each with
// its TileKind. The mask's key ranges -- key_ranges(), or streamed by for_each_key_range()
// for data masks such as BlockMask, or all keys without either -- are cut into tiles of at
// most `max_keys` from each range's start, and each tile is classified (Partial without
// classify()). Empty tiles are never visited.
#pragma once

#include <algorithm>

#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit::detail {

// The visitor type for_each_key_range() is probed with.
struct KeyRangeVisitorProbe {
  void operator()(Range) const {}
};

/// Calls visit(Range kv, TileKind kind) for each key tile of [0, kv_len) that query
/// positions q may see: kv is at most max_keys long and kind is Full or Partial.
/// `within` (default: all keys) limits the keys further: split-KV decode visits one chunk.
template <class Mask, class Visit>
void for_each_key_tile(const Mask& mask, Index b, Index h, Range q, Index kv_len, Index max_keys,
                       Visit&& visit, Range within = {0, -1}) {
  const Index lo = std::max<Index>(within.begin, 0);
  const Index hi = within.end < 0 ? kv_len : std::min(within.end, kv_len);
  const auto clip = [lo, hi](Range r) {
    const Index end = std::clamp<Index>(r.end, lo, std::max(lo, hi));
    return Range{std::clamp<Index>(r.begin, lo, end), end};
  };
  const auto walk = [&](Range range) {
    const Range keys = clip(range);
    for (Index k0 = keys.begin; k0 < keys.end; k0 += max_keys) {
      const Range kv{k0, std::min(k0 + max_keys, keys.end)};
      const TileKind kind = tile_kind_of(mask, b, h, q, kv);
      if (kind != TileKind::Empty) visit(kv, kind);
    }
  };
  if constexpr (has_for_each_key_range<Mask, Range, KeyRangeVisitorProbe>::value) {
    mask.for_each_key_range(b, h, q, walk);
  } else {
    for (const Range& range : key_ranges_of(mask, b, h, q)) walk(range);
  }
}

/// Whether query positions q see any key tile within `within` (as for_each_key_tile walks it).
template <class Mask>
bool any_key_tile(const Mask& mask, Index b, Index h, Range q, Index kv_len, Index max_keys,
                  Range within) {
  bool any = false;
  for_each_key_tile(
      mask, b, h, q, kv_len, max_keys, [&](Range, TileKind) { any = true; }, within);
  return any;
}

}  // namespace attnkit::detail
