// What a normalizer may know about the rows it normalizes, and the faces the kernels ask of
// it beyond absorb() / finalize(). RowContext names the (batch, head) of a block of query
// rows and the call's key count, so per-head parameters (a softmax sink logit, a sigmoid
// bias) and per-call defaults (sigmoid's -log Lk) need no hook of their own. The helpers in
// detail:: fill in the defaults, so a normalizer writes only the faces it needs:
//   begin(RowContext) or begin()                          -> State
//   reference_row(double* s, n, RowContext) or (s, n)     -> row statistic
//   static constexpr bool kRescales (default true): false = no running max, no rescale
//   static constexpr RowStat kRowStat (default LogSumExp) and lse() / row_sum() to match.
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/tensor.hpp"

namespace attnkit {

/// The (batch, head) of the query rows being normalized, and the call's key count.
struct RowContext {
  Index batch = 0, head = 0, kv_len = 0;
};

/// The partial statistic a normalizer reports per row, written through Options::lse:
/// LogSumExp (softmax: log of the denominator, natural log), Sum (l1 normalizers: the row
/// sum of the weights), None (unnormalized weights, e.g. sigmoid).
enum class RowStat { LogSumExp, Sum, None };

namespace detail {

template <class N, class = void>
struct has_context_begin : std::false_type {};
template <class N>
struct has_context_begin<N, std::void_t<decltype(std::declval<const N&>().begin(RowContext{}))>>
    : std::true_type {};

template <class N, class = void>
struct has_context_reference : std::false_type {};
template <class N>
struct has_context_reference<N, std::void_t<decltype(std::declval<const N&>().reference_row(
                                    std::declval<double*>(), Index{}, RowContext{}))>>
    : std::true_type {};

template <class N, class = void>
struct declares_rescales : std::false_type {};
template <class N>
struct declares_rescales<N, std::void_t<decltype(N::kRescales)>> : std::true_type {};

template <class N, class = void>
struct declares_row_stat : std::false_type {};
template <class N>
struct declares_row_stat<N, std::void_t<decltype(N::kRowStat)>> : std::true_type {};

/// Whether the kernel must rescale the output accumulator by absorb()'s result.
template <class N>
constexpr bool rescales() {
  if constexpr (declares_rescales<N>::value)
    return N::kRescales;
  else
    return true;
}

template <class N>
constexpr RowStat row_stat_kind() {
  if constexpr (declares_row_stat<N>::value)
    return N::kRowStat;
  else
    return RowStat::LogSumExp;
}

template <class N>
auto begin_state(const N& n, const RowContext& ctx) {
  if constexpr (has_context_begin<N>::value)
    return n.begin(ctx);
  else
    return n.begin();
}

/// The row statistic of a State, per lane (for RowStat::None: never called).
template <class N, class State>
auto row_stat(const N& n, const State& st) {
  if constexpr (row_stat_kind<N>() == RowStat::Sum)
    return n.row_sum(st);
  else
    return n.lse(st);
}

template <class N>
double reference_row(const N& n, double* s, Index count, const RowContext& ctx) {
  if constexpr (has_context_reference<N>::value)
    return n.reference_row(s, count, ctx);
  else
    return n.reference_row(s, count);
}

}  // namespace detail
}  // namespace attnkit
