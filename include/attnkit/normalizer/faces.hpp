// What a normalizer may know about the rows it normalizes, and the faces the kernels ask of
// it beyond absorb() / finalize(). RowContext names the (batch, head) of a block of query
// rows and the call's key count, so per-head parameters (a softmax sink logit, a sigmoid
// bias) and per-call defaults (sigmoid's -log Lk) need no hook of their own. The helpers in
// detail:: fill in the defaults, so a normalizer writes only the faces it needs:
//   begin(RowContext) or begin()                          -> State
//   reference_row(double* s, n, RowContext) or (s, n)     -> row statistic
//   static constexpr bool kRescales (default true): false = no running max, no rescale
//   static constexpr RowStat kRowStat (default LogSumExp) and lse() / row_sum() to match.
//   static constexpr bool kCosineLogits (default false): the logits are cos(q_i, k_j), not
//     scale * q_i . k_j (the kernel normalizes the rows; Options::scale is refused)
//   static constexpr bool kCountsKeys (default false): RowContext::visible_keys is filled
//   static constexpr int kPasses (default 1) with observe(State&, s, keys, ld) and
//     end_pass(State&): passes before the last see every key tile's logits and keep
//     statistics only; the last pass absorbs and accumulates values. A normalizer may also
//     ask for the last pass again for some rows: another_pass(State&) -> bool (see
//     softplus_l1_reweighted.hpp).
// Faces for the paths that cut a call into parts, each with its default:
//   part(const KeyPart&) -> a normalizer     the normalizer a part of the keys runs with
//                                            (default: itself; Softmax drops its sinks,
//                                            which the merge adds once)
//   for_head(h) -> a normalizer              the normalizer of a one-head gathered call
//                                            standing for head h (default: itself)
//   second_round(row sums) (kPasses 2)       the two-round form that merges (LSSAR)
//   a sinks member                           the sink logits the merge adds
// The backward faces and their detectors: normalizer/backward_faces.hpp.
#pragma once

#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {

/// The (batch, head) of the query rows being normalized (one SIMD vector of them in the
/// kernel, one row in the reference), the call's key count and head dimension, the flat
/// index of the first row in [B, Hq, Lq] (the index of its row statistic), how many rows
/// are real (the rest are padding lanes), and, for a normalizer with kCountsKeys, the
/// number of keys the mask lets each row see (else null).
struct RowContext {
  Index batch = 0, head = 0, kv_len = 0, head_dim = 0, row = 0, rows = 1;
  const float* visible_keys = nullptr;
};

/// The partial statistic a normalizer reports per row, written through Options::lse:
/// LogSumExp (softmax: log of the denominator, natural log), Sum (l1 normalizers: the row
/// sum of the weights), None (unnormalized weights, e.g. sigmoid).
enum class RowStat { LogSumExp, Sum, None };

/// What a part of a call -- a run of its keys: a split-KV chunk, one sequence's pages, a ring
/// step -- knows of the whole call, handed to a normalizer's part() face. A part that runs
/// as a call of its own (pages, ring steps: own_call) sees only its keys in its RowContext,
/// so a normalizer with per-call defaults takes them from here: the whole call's key count
/// and, on request, each of the part's query rows' visible keys over the whole call.
struct KeyPart {
  Index kv_len = 0;       // the whole call's keys
  bool own_call = false;  // false: the part runs inside the whole call (split-KV chunks)
  // The part's rows among the rows that per-row data given to the normalizer covers
  // ([B * Hq * Lq] of the whole call): [first_row, first_row + rows); rows < 0: all of them.
  Index first_row = 0, rows = -1;
  std::function<std::vector<float>()> visible_keys;  // own_call: each row's whole-call count

  /// A part that runs inside the whole call (a split-KV chunk).
  static KeyPart inside(Index kv_len) {
    KeyPart part;
    part.kv_len = kv_len;
    return part;
  }
  /// A part that runs as a call of its own, over rows [first_row, first_row + rows) of the
  /// call's (rows < 0: all), with each row's visible keys over the whole call on request.
  static KeyPart own(Index kv_len, Index first_row, Index rows,
                     std::function<std::vector<float>()> visible) {
    KeyPart part;
    part.kv_len = kv_len;
    part.own_call = true;
    part.first_row = first_row;
    part.rows = rows;
    part.visible_keys = std::move(visible);
    return part;
  }
};

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

template <class N, class = void>
struct declares_cosine_logits : std::false_type {};
template <class N>
struct declares_cosine_logits<N, std::void_t<decltype(N::kCosineLogits)>> : std::true_type {};

template <class N, class = void>
struct declares_counts_keys : std::false_type {};
template <class N>
struct declares_counts_keys<N, std::void_t<decltype(N::kCountsKeys)>> : std::true_type {};

template <class N, class = void>
struct declares_passes : std::false_type {};
template <class N>
struct declares_passes<N, std::void_t<decltype(N::kPasses)>> : std::true_type {};

template <class N, class = void>
struct has_another_pass : std::false_type {};
template <class N>
struct has_another_pass<N, std::void_t<decltype(std::declval<const N&>().another_pass(
                               std::declval<typename N::State&>()))>> : std::true_type {};

/// Whether the logits are cosines (rows of q and k normalized) instead of scaled dots.
template <class N>
constexpr bool cosine_logits() {
  if constexpr (declares_cosine_logits<N>::value)
    return N::kCosineLogits;
  else
    return false;
}

/// Whether the normalizer needs each row's visible key count in RowContext.
template <class N>
constexpr bool counts_keys() {
  if constexpr (declares_counts_keys<N>::value)
    return N::kCountsKeys;
  else
    return false;
}

/// How many passes over the keys the normalizer needs (the last one accumulates values).
template <class N>
constexpr int passes() {
  if constexpr (declares_passes<N>::value) {
    static_assert(N::kPasses >= 1, "Normalizer::kPasses must be at least 1");
    return N::kPasses;
  } else {
    return 1;
  }
}

/// After the last pass: whether some rows of st need it once more (false by default).
template <class N, class State>
bool another_pass(const N& n, State& st) {
  if constexpr (has_another_pass<N>::value)
    return n.another_pass(st);
  else
    return false;
}

template <class N, class = void>
struct has_observe : std::false_type {};
template <class N>
struct has_observe<
    N,
    std::void_t<decltype(std::declval<const N&>().observe(
                    std::declval<typename N::State&>(), std::declval<float*>(), Index{}, Index{})),
                decltype(std::declval<const N&>().end_pass(std::declval<typename N::State&>()))>>
    : std::true_type {};

template <class N, class = void>
struct has_lse : std::false_type {};
template <class N>
struct has_lse<N, std::void_t<decltype(std::declval<const N&>().lse(
                      std::declval<const typename N::State&>()))>> : std::true_type {};

template <class N, class = void>
struct has_row_sum : std::false_type {};
template <class N>
struct has_row_sum<N, std::void_t<decltype(std::declval<const N&>().row_sum(
                          std::declval<const typename N::State&>()))>> : std::true_type {};

/// Compile-time checks of a normalizer's faces against what it declares, with the reason.
template <class N>
constexpr bool check_normalizer() {
  static_assert(passes<N>() == 1 || has_observe<N>::value,
                "Normalizer: kPasses > 1 needs observe(State&, float*, Index, Index) and "
                "end_pass(State&) for the passes before the last");
  static_assert(row_stat_kind<N>() != RowStat::LogSumExp || has_lse<N>::value,
                "Normalizer: RowStat::LogSumExp (the default kRowStat) needs lse(const State&); "
                "declare kRowStat = RowStat::None if the rule has no row statistic");
  static_assert(row_stat_kind<N>() != RowStat::Sum || has_row_sum<N>::value,
                "Normalizer: RowStat::Sum needs row_sum(const State&)");
  return true;
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

template <class N, class = void>
struct has_part : std::false_type {};
template <class N>
struct has_part<N, std::void_t<decltype(std::declval<const N&>().part(KeyPart{}))>>
    : std::true_type {};

/// The normalizer a part of the keys runs with: n.part(part), or n itself.
template <class N>
decltype(auto) part_normalizer(const N& n, const KeyPart& part) {
  if constexpr (has_part<N>::value)
    return n.part(part);
  else
    return (n);
}

template <class N, class = void>
struct has_for_head : std::false_type {};
template <class N>
struct has_for_head<N, std::void_t<decltype(std::declval<const N&>().for_head(Index{}))>>
    : std::true_type {};

/// The normalizer of a one-head gathered call standing for head h: n.for_head(h), or n.
template <class N>
decltype(auto) head_normalizer(const N& n, Index h) {
  if constexpr (has_for_head<N>::value)
    return n.for_head(h);
  else
    return (n);
}

template <class N, class = void>
struct has_second_round : std::false_type {};
template <class N>
struct has_second_round<
    N, std::void_t<decltype(std::declval<const N&>().second_round(std::vector<float>{}))>>
    : std::true_type {};

template <class N, class = void>
struct has_sinks : std::false_type {};
template <class N>
struct has_sinks<N, std::void_t<decltype(std::declval<const N&>().sinks)>> : std::true_type {};

/// True when parts of a row computed apart merge exactly by their LSE (o = sum_p
/// exp(lse_p - lse) o_p): one pass, a LogSumExp statistic.
template <class N>
constexpr bool merges_by_lse() {
  return row_stat_kind<N>() == RowStat::LogSumExp && passes<N>() == 1;
}

}  // namespace detail

/// The row statistic normalizer N reports (its kRowStat; LogSumExp when it declares none):
/// what attention() writes through Options::lse and attention_backward() reads back. None
/// (Sigmoid): both refuse a buffer. `if constexpr (row_statistic_of<N>() != RowStat::None)`.
template <class N>
constexpr RowStat row_statistic_of() {
  return detail::row_stat_kind<N>();
}

}  // namespace attnkit
