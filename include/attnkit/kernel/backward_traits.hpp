// Detection of the backward faces of the policies (attention_backward(),
// reference::attention_backward()). Each face is optional on the policy; the entry points
// static_assert the ones a spec needs, naming the face that is missing.
//   Normalizer: begin_backward(RowContext, Vec stat, Vec delta) -> BackwardState,
//               backward(const BackwardState&, float* s, float* ds, keys, ld) -> Vec,
//               reference_backward(const double* s, const double* p, double* dp, n, stat,
//                                  RowContext) -> double; optional row_param_grad(state)
//               and kTrainedParam (the name of its per-head parameter, for messages).
//   Score:      nothing (Dot), kUnitDerivative = true (an added bias: Alibi), or
//               derivative(double s, b, h, i, j) and derivative_tile(t, g, keys, lanes, ld,
//               ScoreTile).
//   Position:   apply_transpose(float*, dim, RowAt) and reference_apply_transpose(double*,
//               dim, RowAt) for a row transform (Rope, Fope); trained parameters (Fope):
//               param_count() and accumulate_param_grad(x, g, RowAt, double* acc); a product
//               owner (Tapa): combine_backward(s, s2, ds, ds2, keys, lanes, ld, q_begin,
//               k_begin, d, work) and reference_logit_grad(q, k, d, i, j, dlogit, dq, dk).
#pragma once

#include <type_traits>

#include "attnkit/detail/traits.hpp"
#include "attnkit/normalizer/row_context.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/position/row_at.hpp"
#include "attnkit/score/score_tile.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

template <class N, class = void>
struct has_normalizer_backward : std::false_type {};
template <class N>
struct has_normalizer_backward<
    N, std::void_t<typename N::BackwardState,
                   decltype(std::declval<const N&>().begin_backward(RowContext{}, simd::Vec{},
                                                                    simd::Vec{})),
                   decltype(std::declval<const N&>().backward(
                       std::declval<const typename N::BackwardState&>(), std::declval<float*>(),
                       std::declval<float*>(), Index{}, Index{})),
                   decltype(std::declval<const N&>().reference_backward(
                       std::declval<const double*>(), std::declval<const double*>(),
                       std::declval<double*>(), Index{}, double{}, RowContext{}))>>
    : std::true_type {};

template <class N, class = void>
struct has_row_param_grad : std::false_type {};
template <class N>
struct has_row_param_grad<N, std::void_t<decltype(std::declval<const N&>().row_param_grad(
                                 std::declval<const typename N::BackwardState&>()))>>
    : std::true_type {};

template <class N, class = void>
struct has_trained_param : std::false_type {};
template <class N>
struct has_trained_param<N, std::void_t<decltype(N::kTrainedParam)>> : std::true_type {};

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

template <class P, class = void>
struct has_apply_transpose : std::false_type {};
template <class P>
struct has_apply_transpose<P,
                           std::void_t<decltype(std::declval<const P&>().apply_transpose(
                                           std::declval<float*>(), Index{}, RowAt{})),
                                       decltype(std::declval<const P&>().reference_apply_transpose(
                                           std::declval<double*>(), Index{}, RowAt{}))>>
    : std::true_type {};

template <class P, class = void>
struct has_product_backward : std::false_type {};
template <class P>
struct has_product_backward<
    P,
    std::void_t<decltype(std::declval<const P&>().combine_backward(
                    std::declval<const float*>(), std::declval<const float*>(),
                    std::declval<float*>(), std::declval<float*>(), Index{}, Index{}, Index{},
                    Index{}, Index{}, Index{}, std::declval<float*>())),
                decltype(std::declval<const P&>().reference_logit_grad(
                    std::declval<const double*>(), std::declval<const double*>(), Index{}, Index{},
                    Index{}, double{}, std::declval<double*>(), std::declval<double*>()))>>
    : std::true_type {};

template <class P, class = void>
struct has_position_param_grad : std::false_type {};
template <class P>
struct has_position_param_grad<
    P, std::void_t<decltype(std::declval<const P&>().param_count()),
                   decltype(std::declval<const P&>().accumulate_param_grad(
                       std::declval<const float*>(), std::declval<const float*>(), RowAt{},
                       std::declval<double*>()))>> : std::true_type {};

/// The Position's trained parameters (0 for a Position without any).
template <class P>
Index position_param_count(const P& position) {
  if constexpr (has_position_param_grad<P>::value)
    return position.param_count();
  else
    return 0;
}

/// The faces a spec needs for attention_backward() and reference::attention_backward(),
/// each a static_assert naming what is missing. True when they are all there.
template <class Spec>
constexpr bool check_backward_spec() {
  using Normalizer = typename Spec::Normalizer;
  using Score = typename Spec::Score;
  using Position = typename Spec::Position;
  static_assert(has_normalizer_backward<Normalizer>::value,
                "attention_backward(): the normalizer has no backward face (begin_backward(), "
                "backward(), reference_backward(): kernel/backward_traits.hpp). LSSAR "
                "(SoftplusL1Reweighted) has none yet");
  static_assert(passes<Normalizer>() == 1,
                "attention_backward(): multi-pass normalizers (LSSAR) are not supported yet");
  static_assert(unit_derivative<Score>() ||
                    (has_derivative<Score>::value && has_derivative_tile<Score>::value),
                "attention_backward(): the Score needs derivative() and derivative_tile() (or "
                "kUnitDerivative = true for an added bias)");
  static_assert(!owns_product<Position>() || has_product_backward<Position>::value,
                "attention_backward(): a Position that owns the product needs combine_backward() "
                "and reference_logit_grad()");
  static_assert(std::is_same_v<Position, NoPosition> || owns_product<Position>() ||
                    has_apply_transpose<Position>::value,
                "attention_backward(): the Position needs apply_transpose() and "
                "reference_apply_transpose()");
  return true;
}

}  // namespace attnkit::detail
