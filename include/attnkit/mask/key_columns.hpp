// The gathered-columns face of a mask. A mask whose kept keys are scattered -- PowerOfTwo's
// keys at distances 2^k, dilated or strided patterns, positions a user picks -- can describe
// itself as the union of a mask of ranges and, per query, a few isolated key columns:
//
//   auto range_part() const;                         // a mask: the keys that come in ranges
//   KeyColumns<N> columns(Index b, Index h, Index i) const;  // query i's other keys, ascending
//
// keep(b, h, i, j) must equal range_part().keep(b, h, i, j) || j is in columns(b, h, i), and
// no column may be a key range_part() keeps. attention() then walks its key tiles over
// range_part() alone (with that mask's own faces: key ranges, tile kinds, runs) and forms each
// query's columns row by row, so the work follows the pairs kept instead of the 64-key bands
// that hold them. range_part() should be cheap to build: the kernel asks for it once per
// thread, and combinators ask for it per key.
#pragma once

#include <cassert>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "attnkit/core/tensor.hpp"

namespace attnkit {

/// At most N key positions of one query, strictly ascending.
template <int N>
struct KeyColumns {
  static_assert(N >= 1, "KeyColumns: capacity must be at least 1");
  static constexpr int kCapacity = N;

  Index keys[std::size_t{N}];  // the first `count` hold keys (left unset past them: a
  int count = 0;               // query has a few of its capacity, and masks build one a query)

  /// Appends key j, which must be above the last one. A column past the capacity is a bug
  /// in the mask (debug builds assert); it is dropped rather than written out of bounds.
  void add(Index j) {
    assert((count == 0 || j > keys[count - 1]) && "KeyColumns::add: keys out of order");
    assert(count < N && "KeyColumns::add: more columns than capacity");
    if (count < N) keys[count++] = j;
  }

  const Index* begin() const { return keys; }
  const Index* end() const { return keys + count; }
};

namespace detail {

// Mask: range_part() and columns(b, h, i) -> KeyColumns<N>.
template <class P, class = void>
struct has_columns : std::false_type {};
template <class P>
struct has_columns<
    P, std::void_t<decltype(std::declval<const P&>().range_part()),
                   decltype(std::declval<const P&>().columns(Index{}, Index{}, Index{}))>>
    : std::true_type {};

/// The columns of query i of a mask with the face; none for any other mask.
template <class M>
auto columns_of(const M& m, Index b, Index h, Index i) {
  if constexpr (has_columns<M>::value)
    return m.columns(b, h, i);
  else
    return KeyColumns<1>{};
}

/// Whether the mask's range part keeps (i, j): its keep() for a mask without columns.
template <class M>
bool range_part_keeps(const M& m, Index b, Index h, Index i, Index j) {
  if constexpr (has_columns<M>::value)
    return m.range_part().keep(b, h, i, j);
  else
    return m.keep(b, h, i, j);
}

/// The keys of x and of y for which keep_x / keep_y hold, ascending, each once.
template <int A, int B, class KeepX, class KeepY>
KeyColumns<A + B> merge_columns(const KeyColumns<A>& x, const KeyColumns<B>& y, KeepX&& keep_x,
                                KeepY&& keep_y) {
  KeyColumns<A + B> out;
  int s = 0, t = 0;
  const auto take = [&](Index j, bool kept) {
    if (kept && (out.count == 0 || out.keys[out.count - 1] != j)) out.add(j);
  };
  while (s < x.count || t < y.count) {
    if (t == y.count || (s < x.count && x.keys[s] <= y.keys[t])) {
      take(x.keys[s], keep_x(x.keys[s]));
      ++s;
    } else {
      take(y.keys[t], keep_y(y.keys[t]));
      ++t;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace attnkit
