// stripe_attention_backward(): the gradients of stripe_attention() (select/stripes.hpp). The
// forward runs, per (batch, q head, big block), the big block's contiguous query rows over
// the key columns the selection gives it (init, kept, local) gathered into one call under a
// Remapped causal mask; every query row is in exactly one call, so its row statistic is its
// own call's. The backward runs attention_backward() on the same parts (the final o, d_o and
// statistic of the big block's rows), puts dq rows back and adds each gathered key's dk, dv
// into f32 sums of its key row (a key is gathered by several big blocks and, with GQA, by
// every query head of its group), in (batch, head, big block) order
// (select/gather_backward.hpp): any normalizer with a backward face, bitwise identical for
// any thread count. As in the forward, a normalizer that reads the call's Lk sees the number
// of gathered columns.
#pragma once

#include <cstddef>
#include <vector>

#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/kernel/backward/backward_checks.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/options.hpp"
#include "attnkit/param_grads.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/select/gather_backward.hpp"
#include "attnkit/select/stripes.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// Writes dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D] and dv [B, Hkv, Lk, Dv], the gradients of a
/// loss through o = stripe_attention(spec, q, k, v, o, selection, options) given d_o = dL/do,
/// and, when grads.normalizer is set, the normalizer's per-head parameter gradient [Hq].
/// `o` and options.lse are the forward call's output and row statistic (options.lse required
/// when the normalizer has one: Options::with_lse on both calls); selection, scale and
/// q_offset as in the forward. Gradients are summed in f32 and stored in their views' types;
/// they must not share memory with any input. Throws Error before writing anything on bad
/// input; bitwise identical for any thread count.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void stripe_attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k,
                               const View<V>& v, const View<O>& o, const View<GO>& d_o,
                               const View<GQ>& dq, const View<GK>& dk, const View<GV>& dv,
                               const StripeSelection& selection, const Options& options = {},
                               const ParamGrads& grads = {}) {
  select::check_gathered_spec<Spec>();
  const Problem p =
      detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);
  selection.validate(p.batch, p.q_heads, p.q_len, p.kv_len, p.q_offset);
  if (p.kv_len == 0)  // no key, no column: as the forward
    return attention_backward(spec, q, k, v, o, d_o, dq, dk, dv, options, grads);

  select::CallSums sums(p);
  select::GatheredRows<K> keys;
  select::GatheredRows<V> values;
  select::PartGrads part;
  select::for_each_stripe_part(spec, p, selection, options,
                               [&](Index b, Index h, Range rows, const std::vector<Index>& cols,
                                   const auto& part_spec, const Options& call) {
                                 if (cols.empty()) return;  // rows that see no key: zero gradients
                                 const Index hk = p.kv_head(h);
                                 select::gather_rows(k, b, hk, cols, keys);
                                 select::gather_rows(v, b, hk, cols, values);
                                 select::part_backward(part_spec, select::block_rows(q, b, h, rows),
                                                       keys.view(), values.view(),
                                                       select::block_rows(o, b, h, rows),
                                                       select::block_rows(d_o, b, h, rows), call,
                                                       !grads.normalizer.empty(), part);
                                 sums.add(part, b, h, hk, nullptr, rows.begin, cols.data(), 0);
                               });
  sums.store(dq, dk, dv, grads.normalizer);
}

}  // namespace attnkit
