// The checks of attention_backward() and reference::attention_backward(), shared: the
// forward's views and options as attention() checks them, then d_o shaped as o, each
// gradient shaped as its input, every gradient (and the parameter gradient) disjoint from
// every input and from the others, and the forward's row statistic present when the
// normalizer has one. All before anything is written.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/backward/backward_traits.hpp"
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

inline ByteSpan float_span(Span<float> s) {
  const auto begin = reinterpret_cast<std::uintptr_t>(s.data());
  return {begin, begin + static_cast<std::uintptr_t>(s.size()) * sizeof(float)};
}

/// A named byte range, for the aliasing checks.
struct NamedSpan {
  ByteSpan bytes;
  const char* name;
};

/// dq, dk, dv checked as views, shaped as q, k, v, with distinct rows; each of them and of
/// `outputs` (more written buffers) disjoint from q, k, v, every one of `inputs` and each
/// other. Shared by every backward entry point.
template <class Q, class K, class V, class GQ, class GK, class GV>
void check_gradients(const View<Q>& q, const View<K>& k, const View<V>& v, const View<GQ>& dq,
                     const View<GK>& dk, const View<GV>& dv,
                     std::initializer_list<NamedSpan> inputs,
                     std::initializer_list<NamedSpan> outputs = {}) {
  check_view(dq, "dq");
  check_view(dk, "dk");
  check_view(dv, "dv");
  require_same_shape(dq, q, "dq", "q");
  require_same_shape(dk, k, "dk", "k");
  require_same_shape(dv, v, "dv", "v");
  check_rows_distinct(dq, "dq");
  check_rows_distinct(dk, "dk");
  check_rows_distinct(dv, "dv");
  std::vector<NamedSpan> in{{byte_span(q), "q"}, {byte_span(k), "k"}, {byte_span(v), "v"}};
  in.insert(in.end(), inputs.begin(), inputs.end());
  std::vector<NamedSpan> out{{byte_span(dq), "dq"}, {byte_span(dk), "dk"}, {byte_span(dv), "dv"}};
  out.insert(out.end(), outputs.begin(), outputs.end());
  for (std::size_t a = 0; a < out.size(); ++a) {
    for (const NamedSpan& i : in) require_disjoint(out[a].bytes, out[a].name, i.bytes, i.name);
    for (std::size_t b = a + 1; b < out.size(); ++b)
      require_disjoint(out[a].bytes, out[a].name, out[b].bytes, out[b].name);
  }
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
  require_out_dims(d_o, q, v, "d_o");
  // An empty batch reads no statistic: a training loop's empty batch passes the forward's
  // Options (a null buffer for zero rows) to the backward as well.
  if constexpr (row_stat_kind<Normalizer>() != RowStat::None)
    require(!options.lse.empty() || p.batch * p.q_heads * p.q_len == 0, "Options.lse",
            "the forward call's row statistic (Options::with_lse), read by the backward",
            "nullptr");
  if constexpr (!has_trained_param<Normalizer>::value)
    require(grads.normalizer.empty(), "ParamGrads.normalizer",
            "nullptr (this normalizer has no trained parameter)", "a buffer");
  if (!grads.position.empty())
    require(position_param_count(spec.position) > 0, "ParamGrads.position",
            "nullptr (this Position has no trained parameter)", "a buffer");
  require_span_size(grads.normalizer, p.q_heads, "ParamGrads.normalizer.size()", "q.heads");
  require_span_size(grads.position, position_param_count(spec.position),
                    "ParamGrads.position.size()", "the Position's param_count()");
  validate_policies(spec, p, options);

  check_gradients(q, k, v, dq, dk, dv,
                  {{byte_span(o), "o"}, {byte_span(d_o), "d_o"}, {float_span(options.lse), "lse"}},
                  {{float_span(grads.normalizer), "ParamGrads.normalizer"},
                   {float_span(grads.position), "ParamGrads.position"}});
  return p;
}

}  // namespace attnkit::detail
