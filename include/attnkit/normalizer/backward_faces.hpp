// The backward faces of a normalizer (attention_backward()) and their detectors; the forward
// faces are in normalizer/faces.hpp. A normalizer with a backward writes
//   using BackwardState = ...;
//   begin_backward(RowContext, Vec stat, Vec delta) -> BackwardState
//   backward(const BackwardState&, float* s, float* ds, Index keys, Index ld) -> Vec
//   reference_backward(const double* s, const double* dp, double* ds, Index n, double delta,
//                      RowContext)
// and, optionally, row_param_grad(state) with kTrainedParam (a trained per-head parameter:
// a sink logit, a bias), and kBackwardPasses > 1 with observe_backward(), end_backward_pass()
// and backward_pass_reads_dp() (passes before the last see every key tile; LSSAR). Which
// specs have a backward is check_backward_spec() (kernel/backward/backward_traits.hpp).
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/core/index.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/simd/simd.hpp"

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
struct declares_backward_passes : std::false_type {};
template <class N>
struct declares_backward_passes<N, std::void_t<decltype(N::kBackwardPasses)>> : std::true_type {};

template <class N, class = void>
struct has_backward_observe : std::false_type {};
template <class N>
struct has_backward_observe<
    N, std::void_t<decltype(std::declval<const N&>().observe_backward(
                       std::declval<typename N::BackwardState&>(), int{}, std::declval<float*>(),
                       std::declval<const float*>(), Index{}, Index{})),
                   decltype(std::declval<const N&>().end_backward_pass(
                       std::declval<typename N::BackwardState&>(), int{})),
                   decltype(N::backward_pass_reads_dp(int{}))>> : std::true_type {};

/// How many passes over the keys the normalizer's backward makes (the last one forms dS).
template <class N>
constexpr int backward_passes() {
  if constexpr (declares_backward_passes<N>::value) {
    static_assert(N::kBackwardPasses >= 1, "Normalizer::kBackwardPasses must be at least 1");
    return N::kBackwardPasses;
  } else {
    return 1;
  }
}

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

}  // namespace attnkit::detail
