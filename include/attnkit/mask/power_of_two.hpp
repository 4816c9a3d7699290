// PowerOfTwo{sinks, window} (PowerAttention): query i sees the keys at distance 2^k
// (k >= 0) behind it, the keys of a local window i - window <= j <= i, and the first `sinks`
// keys; never a future key. A static pattern of O(log L) keys per query beyond the window.
// It has no runs() face (a query's keys are up to ~62 single points): Partial tiles are
// masked with keep(), and key_ranges() keeps them to the few 64-key bands that hold points.
#pragma once

#include <algorithm>

#include "attnkit/error.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/slots.hpp"

namespace attnkit {

struct PowerOfTwo {
  using slot = MaskSlot;

  static constexpr int kMaxPower = 62;  // distances up to 2^62: |q_offset| <= 2^62, keys >= 0

  Index sinks = 0, window = 0;

  /// Throws Error for negative sizes.
  PowerOfTwo(Index sink_count, Index window_keys)
      : sinks(sink_count), window(std::min(window_keys, Index{1} << 60)) {
    detail::require(sink_count >= 0, "PowerOfTwo.sinks", ">= 0", sink_count);
    detail::require(window_keys >= 0, "PowerOfTwo.window", ">= 0", window_keys);
  }

  bool keep(Index /*b*/, Index /*h*/, Index i, Index j) const {
    const Index d = i - j;
    if (d < 0) return false;
    return j < sinks || d <= window || (d & (d - 1)) == 0;
  }

  /// Sinks, the bands [q.begin - 2^k, q.last() - 2^k] beyond the window, and the window, in
  /// key order, clipped at 0 and merged where they touch.
  KeyRanges<kMaxPower + 3> key_ranges(Index /*b*/, Index /*h*/, Range q) const {
    KeyRanges<kMaxPower + 3> r;
    r.add({0, std::min(sinks, q.end)});
    for (int k = kMaxPower; k >= 0; --k) {
      const Index d = Index{1} << k;
      if (d <= window) break;
      r.add({std::max<Index>(q.begin - d, 0), q.last() - d + 1});
    }
    r.add({std::max<Index>(q.begin - window, 0), q.end});
    return r;
  }

  TileKind classify(Index /*b*/, Index /*h*/, Range q, Range kv) const {
    if (kv.begin > q.last()) return TileKind::Empty;  // the future of every query
    if (kv.last() > q.begin) return TileKind::Partial;
    const bool in_sinks = kv.begin >= 0 && kv.end <= sinks;
    const bool in_window = kv.begin >= q.last() - window;
    return in_sinks || in_window ? TileKind::Full : TileKind::Partial;
  }
};

}  // namespace attnkit
