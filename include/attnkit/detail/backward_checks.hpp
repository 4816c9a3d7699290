// The checks of attention_backward() and reference::attention_backward(), shared: the
// forward's views and options as attention() checks them, then d_o shaped as o, each
// gradient shaped as its input, every gradient (and the parameter gradient) disjoint from
// every input and from the others, and the forward's row statistic present when the
// normalizer has one. All before anything is written.
#pragma once

#include <cstdint>

#include "attnkit/detail/backward_traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/options.hpp"
#include "attnkit/param_grads.hpp"
#include "attnkit/problem.hpp"

namespace attnkit::detail {

template <class A, class B, class Name, class Source>
void require_same_shape(const View<A>& a, const View<B>& b, const Name& name,
                        const Source& source) {
  require_dim(a.batch, b.batch, cat(name, ".batch"), cat(source, ".batch"));
  require_dim(a.heads, b.heads, cat(name, ".heads"), cat(source, ".heads"));
  require_dim(a.seq, b.seq, cat(name, ".seq"), cat(source, ".seq"));
  require_dim(a.dim, b.dim, cat(name, ".dim"), cat(source, ".dim"));
}

inline ByteSpan float_span(const float* p, Index n) {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  return {begin, p == nullptr ? begin : begin + static_cast<std::uintptr_t>(n) * sizeof(float)};
}

/// The Problem of a backward call, every argument checked (see the file comment).
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
Problem make_backward_problem(const Spec& spec, const View<Q>& q, const View<K>& k,
                              const View<V>& v, const View<O>& o, const View<GO>& d_o,
                              const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv,
                              const Options& options, const ParamGrads& grads) {
  using Normalizer = typename Spec::Normalizer;
  const Problem p = make_problem(q, k, v, o, options);
  check_view(d_o, "d_o");
  check_view(dq, "dq");
  check_view(dk, "dk");
  check_view(dv, "dv");
  require_same_shape(d_o, o, "d_o", "o");
  require_same_shape(dq, q, "dq", "q");
  require_same_shape(dk, k, "dk", "k");
  require_same_shape(dv, v, "dv", "v");
  check_rows_distinct(dq, "dq");
  check_rows_distinct(dk, "dk");
  check_rows_distinct(dv, "dv");
  if constexpr (row_stat_kind<Normalizer>() != RowStat::None)
    require(options.lse != nullptr, "Options.lse",
            "the forward call's row statistic (Options::with_lse), read by the backward",
            "nullptr");
  if constexpr (!has_trained_param<Normalizer>::value)
    require(grads.normalizer == nullptr, "ParamGrads.normalizer",
            "nullptr (this normalizer has no trained parameter)", "a buffer");
  if (grads.position != nullptr)
    require(position_param_count(spec.position) > 0, "ParamGrads.position",
            "nullptr (this Position has no trained parameter)", "a buffer");
  validate_policies(spec, p, options);

  const Index rows = p.batch * p.q_heads * p.q_len;  // checked by make_problem with lse
  const ByteSpan in[6] = {byte_span(q), byte_span(k),   byte_span(v),
                          byte_span(o), byte_span(d_o), float_span(options.lse, rows)};
  const char* in_names[6] = {"q", "k", "v", "o", "d_o", "lse"};
  const ByteSpan out[5] = {byte_span(dq), byte_span(dk), byte_span(dv),
                           float_span(grads.normalizer, p.q_heads),
                           float_span(grads.position, position_param_count(spec.position))};
  const char* out_names[5] = {"dq", "dk", "dv", "ParamGrads.normalizer", "ParamGrads.position"};
  for (int a = 0; a < 5; ++a) {
    for (int i = 0; i < 6; ++i) require_disjoint(out[a], out_names[a], in[i], in_names[i]);
    for (int b = a + 1; b < 5; ++b) require_disjoint(out[a], out_names[a], out[b], out_names[b]);
  }
  return p;
}

}  // namespace attnkit::detail
