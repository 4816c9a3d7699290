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

// Any policy: validate(q_len, kv_len, q_offset, batch, q_heads) throws Error when the
// policy's own data does not fit the call (a BlockMask built for other sizes).
template <class P, class = void>
struct has_validate : std::false_type {};
template <class P>
struct has_validate<P, std::void_t<decltype(std::declval<const P&>().validate(
                           Index{}, Index{}, Index{}, Index{}, Index{}))>> : std::true_type {};

template <class P, class = void>
struct has_validate_head_dim : std::false_type {};
template <class P>
struct has_validate_head_dim<
    P, std::void_t<decltype(std::declval<const P&>().validate_head_dim(Index{}))>>
    : std::true_type {};

/// Calls p.validate_head_dim(head_dim) when the policy has that face.
template <class P>
void validate_head_dim_of(const P& p, Index head_dim) {
  if constexpr (has_validate_head_dim<P>::value) p.validate_head_dim(head_dim);
}

}  // namespace attnkit::detail
