// all_or_here_backward(): the gradients of all_or_here() (select/all_or_here.hpp). The forward
// runs, per (batch, head), the queries routed to full attention and those routed to the window
// as two gathered calls under Remapped causal / windowed masks; every query row is in exactly
// one of them, so its row statistic is its own call's. The backward runs attention_backward()
// on the same two parts (the final o, d_o and statistic gathered for their rows) and adds the
// parts' dq rows, dk and dv into f32 sums in a fixed order (batch, head, full then window:
// select/gather_backward.hpp), so any normalizer with a backward face works and the result is
// bitwise identical for any thread count.
#pragma once

#include <type_traits>
#include <vector>

#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/mask/sliding_window.hpp"
#include "attnkit/options.hpp"
#include "attnkit/param_grads.hpp"
#include "attnkit/select/all_or_here.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/select/gather_backward.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of a
/// loss through o = all_or_here(spec, q, k, v, o, routes, window, options) given d_o = dL/do,
/// and, when grads.normalizer is set, the normalizer's per-head parameter gradient [Hq]
/// (Softmax sinks, Sigmoid / ReluPower bias). `o` and options.lse are the forward call's
/// output and row statistic (options.lse required when the normalizer has one: Options::
/// with_lse on both calls); routes, window, scale, q_offset as in the forward. Gradients are
/// summed in f32 and stored in their views' types; they must not share memory with any input.
/// Throws Error before writing anything on bad input; bitwise identical for any thread count.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void all_or_here_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                          const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                          const View<GK>& dk, const View<GV>& dv, const AhaRoutes& routes,
                          Index window = 256, const Options& options = {},
                          const ParamGrads& grads = {}) {
  select::check_gathered_spec<Spec>();
  const Problem p =
      detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);
  select::check_aha_call(p, routes, window);
  if (p.kv_len == 0) return attention_backward(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);

  select::CallSums sums(p);
  select::GatheredRows<Q> q_rows;
  select::GatheredRows<O> o_rows;
  select::GatheredRows<GO> do_rows;
  std::vector<float> stat;
  select::PartGrads part;
  select::for_each_aha_part(
      spec, p, routes, window,
      [&](Index b, Index h, const std::vector<Index>& rows, const auto& part_spec) {
        const Index hk = p.kv_head(h);
        select::gather_rows(q, b, h, rows, q_rows);
        select::gather_rows(o, b, h, rows, o_rows);
        select::gather_rows(d_o, b, h, rows, do_rows);
        Options call = options.with_q_offset(0);
        call.lse = select::gather_stats(options.lse, p, b, h, rows, stat);
        select::part_backward(part_spec, q_rows.view(), select::head_view(k, b, hk),
                              select::head_view(v, b, hk), o_rows.view(), do_rows.view(), call,
                              !grads.normalizer.empty(), part);
        sums.add(part, b, h, hk, rows.data(), 0, nullptr, 0);
      });
  sums.store(dq, dk, dv, grads.normalizer);
}

}  // namespace attnkit
