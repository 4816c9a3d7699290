// moba_attention_backward(): the gradients of moba_attention() (select/moba.hpp). The forward
// merges, per query row, the parts of its chosen blocks by their LSE: the own block of every
// query in one call (Causal & Chunked), then per (batch, head, past key block) the queries
// that chose it gathered over that block's keys. Recomputed with the FINAL (merged) LSE, a
// part's weights exp(s - LSE) are its share of the merged weights, and D_i = dO_i . O_i is
// the same in every part, so the gradient of the merged result is the sum over the parts of
// attention_backward() on each with the final o and LSE gathered for its rows: the own-block
// call first (written straight into the f32 sums), then the gathered calls in (batch, head,
// block) order, each part's dq rows, dk and dv added in (select/gather_backward.hpp). The
// order is fixed, so the result is bitwise identical for any thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/chunked.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/options.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/select/gather_backward.hpp"
#include "attnkit/select/moba.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of a
/// loss through o = moba_attention(spec, q, k, v, o, routes, block, options) given d_o =
/// dL/do. `o` and options.lse (required) are that forward call's output and whole-row LSE
/// (Options::with_lse on the forward); routes, block, scale and q_offset as in the forward.
/// Softmax without sinks only (no parameter gradient). Gradients are summed in f32 and stored
/// in their views' types; they must not share memory with any input. Throws Error before
/// writing anything on bad input; bitwise identical for any thread count.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void moba_attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                             const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                             const View<GK>& dk, const View<GV>& dv, const BlockRoutes& routes,
                             Index block = 512, const Options& options = {}) {
  select::check_merged_spec<Spec>();
  const Problem p =
      detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, ParamGrads{});
  select::check_moba_call(spec, p, routes, block);
  select::CallSums sums(p);

  // 1. The own block of every query, in one call, into the sums themselves.
  attention_backward(select::moba_part(spec, Causal{} & Chunked{block}), q, k, v, o, d_o,
                     sums.q.view(), sums.k.view(), sums.v.view(),
                     options.with_q_offset(p.q_offset));

  // 2. Per (batch, head, past block): the rows that chose it, over its keys.
  select::GatheredRows<Q> q_rows;
  select::GatheredRows<O> o_rows;
  select::GatheredRows<GO> do_rows;
  std::vector<float> stat;
  select::PartGrads part;
  const auto run_block = [&](Index b, Index h, Index c, const std::vector<Index>& rows,
                             const std::vector<Index>&, const View<K>& keys,
                             const View<V>& values) {
    const Index hk = p.kv_head(h);
    select::gather_rows(q, b, h, rows, q_rows);
    select::gather_rows(o, b, h, rows, o_rows);
    select::gather_rows(d_o, b, h, rows, do_rows);
    const Options call =
        options.with_q_offset(0).with_lse(select::gather_stats(options.lse, p, b, h, rows, stat));
    select::part_backward(select::moba_part(spec, Full{}), q_rows.view(), keys, values,
                          o_rows.view(), do_rows.view(), call, false, part);
    sums.add(part, b, h, hk, rows.data(), 0, nullptr, c * block);
  };
  select::for_each_moba_block(p, routes, block, k, v, run_block, [](Index, Index) {});
  sums.store(dq, dk, dv, nullptr);
}

}  // namespace attnkit
