// superlinear_attention_backward(): the gradients of superlinear_attention()
// (select/superlinear.hpp). The forward attends, per query row, to the keys of its own runs
// (spans and window) with an exact softmax; the backward runs attention_backward() on each
// row alone over those keys gathered (Full mask, the row's final o, d_o and LSE), puts the
// row's dq back and adds the gathered keys' dk, dv into f32 sums of their key rows in
// (batch, head, row) order (select/gather_backward.hpp): bitwise identical for any thread
// count. One call per query row does only the row's own work (k * span + window keys), but
// each call pays attention_backward()'s fixed cost (checks, scratch, a 64-lane query tile for
// one row) and the calls run one after another: a correct backward, not a tuned one.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/options.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/select/gather_backward.hpp"
#include "attnkit/select/superlinear.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of a
/// loss through o = superlinear_attention(spec, q, k, v, o, sel, options) given d_o = dL/do.
/// `o` and options.lse (required) are that forward call's output and LSE; sel, scale and
/// q_offset as in the forward. Softmax without sinks only. The spans are data (the routing
/// query that chose them gets no gradient). Gradients are summed in f32 and stored in their
/// views' types; they must not share memory with any input. Throws Error before writing
/// anything on bad input; bitwise identical for any thread count.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void superlinear_attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k,
                                    const View<V>& v, const View<O>& o, const View<GO>& d_o,
                                    const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv,
                                    const SpanSelection& sel, const Options& options = {}) {
  using Score = typename Spec::Score;
  select::check_merged_spec<Spec>();
  const Problem p =
      detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, ParamGrads{});
  if constexpr (detail::has_sinks<typename Spec::Normalizer>::value)
    detail::require(spec.normalizer.sinks.empty(), "Softmax.sinks", "empty (no sinks here)",
                    "a sink per head");
  detail::check_spans(sel, p);

  using Normalizer = typename Spec::Normalizer;
  const AttentionSpec<Score, Full, Normalizer, NoPosition> row_spec{
      spec.score, Full{}, spec.normalizer, {}};
  select::CallSums sums(p);
  std::vector<Range> runs(static_cast<std::size_t>(sel.topk + 1));
  std::vector<Index> cols;
  select::GatheredRows<K> keys;
  select::GatheredRows<V> values;
  select::PartGrads part;
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      const Index hk = p.kv_head(h);
      for (Index i = 0; i < p.q_len; ++i) {
        const int n = sel.runs(b, h, i, runs.data());
        cols.clear();
        for (int t = 0; t < n; ++t)
          for (Index j = runs[std::size_t(t)].begin; j < runs[std::size_t(t)].end; ++j)
            cols.push_back(j);
        if (cols.empty()) continue;  // a row that sees no key: zero gradients
        select::gather_rows(k, b, hk, cols, keys);
        select::gather_rows(v, b, hk, cols, values);
        const auto row_of = [&](auto view) {  // row i of head h, in place: [1, 1, 1, dim]
          auto one = select::head_view(view, b, h);
          one.data = view.row(b, h, i);
          one.seq = 1;
          return one;
        };
        Options call = options.with_q_offset(0);
        call.lse = Span<float>(options.lse.data() + sel.row(b, h, i), 1);
        select::part_backward(row_spec, row_of(q), keys.view(), values.view(), row_of(o),
                              row_of(d_o), call, false, part);
        sums.add(part, b, h, hk, nullptr, i, cols.data(), 0);
      }
    }
  sums.store(dq, dk, dv, nullptr);
}

}  // namespace attnkit
