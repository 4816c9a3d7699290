// The faces a Mask policy may have, each optional and asked with `if constexpr`: which
// (query, key) pairs exist, answered per tile, per range of keys or per row.
//   classify(b, h, Range q, Range kv) -> TileKind     a tile is Empty, Full or Partial
//   key_ranges(b, h, Range q) -> KeyRanges<N>          the keys any query of q may see
//   runs(b, h, i) -> KeyRanges<N>                      exactly the keys query i sees
//   for_each_key_range(b, h, Range q, visit)           key_ranges() streamed (data masks)
//   allowed(b, h, i, j) -> bool                        the element rule (every mask has it)
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/core/index.hpp"

namespace attnkit::detail {

// Mask: classify(b, h, Range q, Range kv) -> TileKind.
template <class P, class Range, class = void>
struct has_classify : std::false_type {};
template <class P, class Range>
struct has_classify<
    P, Range,
    std::void_t<decltype(std::declval<const P&>().classify(Index{}, Index{}, Range{}, Range{}))>>
    : std::true_type {};

// Mask: key_ranges(b, h, Range q) -> KeyRanges<N>, the keys any query of q may see.
template <class P, class Range, class = void>
struct has_key_ranges : std::false_type {};
template <class P, class Range>
struct has_key_ranges<
    P, Range, std::void_t<decltype(std::declval<const P&>().key_ranges(Index{}, Index{}, Range{}))>>
    : std::true_type {};

// Mask: runs(b, h, i) -> KeyRanges<N>, exactly the keys query i sees.
template <class P, class = void>
struct has_runs : std::false_type {};
template <class P>
struct has_runs<P, std::void_t<decltype(std::declval<const P&>().runs(Index{}, Index{}, Index{}))>>
    : std::true_type {};

// Mask: for_each_key_range(b, h, Range q, visit) calls visit(Range kv) for each range of
// keys some query of q may see, in key order: the streamed form of key_ranges() for data
// masks (BlockMask) whose ranges have no fixed bound.
template <class P, class Range, class Visit, class = void>
struct has_for_each_key_range : std::false_type {};
template <class P, class Range, class Visit>
struct has_for_each_key_range<P, Range, Visit,
                              std::void_t<decltype(std::declval<const P&>().for_each_key_range(
                                  Index{}, Index{}, Range{}, std::declval<Visit&>()))>>
    : std::true_type {};

}  // namespace attnkit::detail
