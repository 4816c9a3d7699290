// KeyRanges<N>: at most N sorted, disjoint key ranges [begin, end) of absolute positions.
// Masks describe with it the keys a query tile may see (key_ranges(), a superset the kernel
// walks) and the keys one query sees (runs(), exact, used to mask Partial tiles with SIMD).
// Combinators intersect and unite them, so `a | b` of two ranges stays two ranges.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <limits>

#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

template <int N>
struct KeyRanges {
  static_assert(N >= 1, "KeyRanges: capacity must be at least 1");
  static constexpr int kCapacity = N;

  Range ranges[std::size_t{N}] = {};
  int count = 0;

  /// Every position (a mask that says nothing about its keys): the kernel clips it.
  static KeyRanges all() {
    constexpr Index kFar = std::numeric_limits<Index>::max() / 4;
    KeyRanges r;
    r.add({-kFar, kFar});
    return r;
  }

  /// Appends x (ignored when empty). Ranges must come in increasing order of begin and fit
  /// in N (unite / intersect size N for the worst case). One that touches or overlaps the
  /// last merges into it. A misuse never writes out of bounds: an out-of-order or
  /// over-capacity range widens the last one to the hull, still a superset of the keys
  /// (fine for key_ranges(), too wide for runs(): debug builds assert).
  void add(Range x) {
    if (x.end <= x.begin) return;
    if (count > 0 && (x.begin <= ranges[count - 1].end || count == N)) {
      assert(x.begin >= ranges[count - 1].begin && "KeyRanges::add: ranges out of order");
      assert(x.begin <= ranges[count - 1].end && "KeyRanges::add: more ranges than capacity");
      ranges[count - 1].begin = std::min(ranges[count - 1].begin, x.begin);
      ranges[count - 1].end = std::max(ranges[count - 1].end, x.end);
      return;
    }
    ranges[count++] = x;
  }

  const Range* begin() const { return ranges; }
  const Range* end() const { return ranges + count; }
};

/// The union of a and b: at most A + B ranges.
template <int A, int B>
KeyRanges<A + B> unite(const KeyRanges<A>& a, const KeyRanges<B>& b) {
  KeyRanges<A + B> out;
  int i = 0, j = 0;
  while (i < a.count || j < b.count) {
    const bool take_a = j == b.count || (i < a.count && a.ranges[i].begin <= b.ranges[j].begin);
    out.add(take_a ? a.ranges[i++] : b.ranges[j++]);
  }
  return out;
}

/// The intersection of a and b: at most A + B - 1 ranges (each boundary starts at most one).
template <int A, int B>
KeyRanges<A + B - 1> intersect(const KeyRanges<A>& a, const KeyRanges<B>& b) {
  KeyRanges<A + B - 1> out;
  int i = 0, j = 0;
  while (i < a.count && j < b.count) {
    const Range& x = a.ranges[i];
    const Range& y = b.ranges[j];
    out.add({std::max(x.begin, y.begin), std::min(x.end, y.end)});
    if (x.end < y.end)
      ++i;
    else
      ++j;
  }
  return out;
}

/// One range.
inline KeyRanges<1> key_range(Index begin, Index end) {
  KeyRanges<1> r;
  r.add({begin, end});
  return r;
}

}  // namespace attnkit
