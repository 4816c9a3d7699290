// Detection of the optional policy hooks. The kernels ask these traits with
// `if constexpr`, so a policy only writes the hooks it needs.
#pragma once

#include <type_traits>

#include "attnkit/score/score_tile.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

// Score: vectorized tile modification apply_tile(float* s, keys, lanes, ld, ScoreTile).
template <class P, class = void>
struct has_apply_tile : std::false_type {};
template <class P>
struct has_apply_tile<P, std::void_t<decltype(std::declval<const P&>().apply_tile(
                             std::declval<float*>(), Index{}, Index{}, Index{}, ScoreTile{}))>>
    : std::true_type {};

// Score: element rule modify(double s, b, h, i, j) -> double.
template <class P, class = void>
struct has_modify : std::false_type {};
template <class P>
struct has_modify<P, std::void_t<decltype(std::declval<const P&>().modify(
                         double{}, Index{}, Index{}, Index{}, Index{}))>> : std::true_type {};

// Mask: classify(b, h, Range q, Range kv) -> TileKind.
template <class P, class Range, class = void>
struct has_classify : std::false_type {};
template <class P, class Range>
struct has_classify<
    P, Range,
    std::void_t<decltype(std::declval<const P&>().classify(Index{}, Index{}, Range{}, Range{}))>>
    : std::true_type {};

// Mask: visible_keys(b, h, Range q) -> Range, the keys any query of q may see.
template <class P, class Range, class = void>
struct has_visible_keys : std::false_type {};
template <class P, class Range>
struct has_visible_keys<
    P, Range,
    std::void_t<decltype(std::declval<const P&>().visible_keys(Index{}, Index{}, Range{}))>>
    : std::true_type {};

}  // namespace attnkit::detail
