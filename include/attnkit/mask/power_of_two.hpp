// PowerOfTwo{sinks, window} (PowerAttention): query i sees the keys at distance 2^k
// (k >= 0) behind it, the keys of a local window i - window <= j <= i, and the first `sinks`
// keys; never a future key. A static pattern of O(log L) keys per query beyond the window.
// It has no runs() face (a query's keys are up to ~62 single points). It has the gathered-
// columns face (mask/key_columns.hpp): range_part() is `Causal & (Sinks | SlidingWindow)`,
// tiled and masked by SIMD compares, and columns() the keys at distances 2^k > window (and a
// few sinks, which the range part then leaves out), formed row by row. Paths that do not read that
// face use keep() on Partial tiles, and key_ranges() keeps them to the few bands of the query
// tile's height that hold points.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/sinks.hpp"
#include "attnkit/mask/sliding_window.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

struct PowerOfTwo {
  using slot = MaskSlot;

  static constexpr int kMaxPower = 62;  // distances up to 2^62: |q_offset| <= 2^62, keys >= 0

  Index sinks = 0, window = 0;

  /// This policy's identity, its parameters included (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    return detail::TagHash::of<PowerOfTwo>().add(sinks).add(window).value();
  }

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

  /// Up to this many sinks are gathered with the columns: as a key tile of their own, 4 sinks
  /// cost a pass of the normalizer and of every query's accumulator for 4 keys (at L 65536,
  /// d 128 on Zen 3, 11% of the window's time), as columns 4 more dot products a query on
  /// rows in cache. More sinks stay a range of the range part, tiled.
  static constexpr Index kGatheredSinks = 16;

  /// The keys that come in ranges: the window and (more than kGatheredSinks of them) the
  /// sinks, never a future key.
  MaskAnd<Causal, MaskOr<Sinks, SlidingWindow>> range_part() const {
    return {Causal{}, {Sinks{sinks <= kGatheredSinks ? 0 : sinks}, SlidingWindow{window, 0}}};
  }

  /// Query i's other keys, ascending: the sinks before its window (up to kGatheredSinks of
  /// them), then i - 2^k for 2^k > window at or past the sinks.
  KeyColumns<kMaxPower + 1 + kGatheredSinks> columns(Index /*b*/, Index /*h*/, Index i) const {
    KeyColumns<kMaxPower + 1 + kGatheredSinks> c;
    if (sinks <= kGatheredSinks)  // i - window: window <= 2^60, |i| about 2^62 at most
      for (Index j = 0; j < std::min(sinks, i - window); ++j) c.add(j);
    if (i <= sinks) return c;  // (i - sinks < 1, without its overflow)
    int k = 0;  // the largest 2^k <= i - sinks, by halving steps (no bit-scan in C++17)
    for (int step = 32; step > 0; step /= 2)
      if (k + step <= kMaxPower && (Index{1} << (k + step)) <= i - sinks) k += step;
    for (; k >= 0; --k) {
      const Index d = Index{1} << k;
      if (d <= window) break;
      c.add(i - d);
    }
    return c;
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
