// The faces a Score policy may have, each optional (none: Dot, the plain scaled product):
//   modify(double s, b, h, i, j) -> double      the element rule (the reference's)
//   apply_tile(float* s, keys, lanes, ld, ScoreTile)   the same rule on a SIMD tile; always
//                                               both or neither
//   kReadsPositions (default: true when it has modify) whether the rule reads (b, h, i, j)
//   Backward: kUnitDerivative (an added bias), or derivative(s, b, h, i, j) and
//   derivative_tile(t, g, keys, lanes, ld, ScoreTile).
// ScoreTile: where a tile of logits sits, handed to apply_tile(). The kernel's logit tiles
// are transposed: s[key, lane] with row stride ld, one SIMD lane per query, so that mods
// depending on (i, j) (ALiBi, user lambdas) can find their positions.
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/core/tensor.hpp"

namespace attnkit {

struct ScoreTile {
  Index batch = 0, head = 0;  // query head
  Index q_begin = 0;          // absolute position of lane 0's query (row + q_offset)
  Index k_begin = 0;          // position of key row 0
};

namespace detail {

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

template <class S, class = void>
struct declares_unit_derivative : std::false_type {};
template <class S>
struct declares_unit_derivative<S, std::void_t<decltype(S::kUnitDerivative)>> : std::true_type {};

template <class S, class = void>
struct has_derivative : std::false_type {};
template <class S>
struct has_derivative<S, std::void_t<decltype(std::declval<const S&>().derivative(
                             double{}, Index{}, Index{}, Index{}, Index{}))>> : std::true_type {};

template <class S, class = void>
struct has_derivative_tile : std::false_type {};
template <class S>
struct has_derivative_tile<S, std::void_t<decltype(std::declval<const S&>().derivative_tile(
                                  std::declval<const float*>(), std::declval<float*>(), Index{},
                                  Index{}, Index{}, ScoreTile{}))>> : std::true_type {};

/// True when the Score leaves the logit's derivative 1 (Dot, or an added bias).
template <class S>
constexpr bool unit_derivative() {
  if constexpr (declares_unit_derivative<S>::value) return S::kUnitDerivative;
  return !has_modify<S>::value && !has_apply_tile<S>::value;
}

template <class S, class = void>
struct declares_reads_positions : std::false_type {};
template <class S>
struct declares_reads_positions<S, std::void_t<decltype(S::kReadsPositions)>> : std::true_type {};

/// True when the Score's logits depend on where they sit -- (b, h, i, j), as ALiBi's bias --
/// and not on the logit alone. A Score says so with kReadsPositions; one that changes the
/// logits without saying is taken to read them, so the paths that see part-local or
/// gathered indices (pages, ring steps, gathered drivers) refuse it, and the decode row
/// engine, whose tiles hold keys in lanes, leaves it to the tile engine.
template <class S>
constexpr bool reads_positions() {
  if constexpr (declares_reads_positions<S>::value)
    return S::kReadsPositions;
  else
    return has_modify<S>::value || has_apply_tile<S>::value;
}

}  // namespace detail
}  // namespace attnkit
