// topk_attention(): attention over per-query key sets of any size chosen at run time
// (DeepSeek Sparse Attention: the indexer's top k, dsa/indexer.hpp), one set per query
// position shared by all its heads. Per (batch, query, KV head): the selected K and V rows
// are gathered once (in their storage type) and the heads that read that KV head run as the
// rows of one tiled-kernel call against them (Mask Full), so the work is proportional to
// Lq x k, and every Score and Normalizer attention() takes serves (a gathered call: no
// Position; apply RoPE before, as DeepSeek caches its rope keys rotated). Plain softmax over
// Dot scores (sinks allowed) takes its own engine (dsa/topk_softmax.hpp: the heads in the lanes
// of the logits); the rest calls the tiled kernel. A normalizer with
// per-head parameters (sinks, per-head biases) runs one head a call. A gathered call's key
// count is the selection's: a normalizer that reads Lk (Sigmoid{}'s default bias -log Lk)
// sees k, not the sequence length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/dsa/topk_checks.hpp"
#include "attnkit/dsa/topk_softmax.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/options.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

namespace detail {

/// Rows [begin, begin + n) of head h's query (or output) row t, as a [1, 1, n, dim] view:
/// the heads of one query position, one a row.
template <class T>
View<T> heads_as_rows(const View<T>& x, Index b, Index h, Index t, Index n) {
  View<T> v = x;
  v.data = x.row(b, h, t);
  v.batch = v.heads = 1;
  v.seq = n;
  v.seq_stride = x.head_stride;
  v.batch_stride = v.head_stride = 0;
  return v;
}

}  // namespace detail

/// o[B, Hq, Lq, Dv] = attention of q [B, Hq, Lq, D] over, for each query position t, the keys
/// `keys.indices` row t names ([B, 1, Lq, topk] int32, -1 entries skipped; shared by every
/// head), of k [B, Hkv, Lk, D] and v [B, Hkv, Lk, Dv] (GQA: head h reads KV head h / (Hq /
/// Hkv); MLA's shared latent is Hkv = 1). The spec's Mask must be Full and its Position
/// NoPosition (the selection is the mask). A query with no key gets 0 (its LSE -inf).
/// Options: scale, threads, lse ([B, Hq, Lq]). Throws Error before writing anything on bad
/// input, including a selection out of range, naming a future key (keys.causal: key s of
/// query t must be <= t + q_offset, default Lk - Lq) or a key twice.
template <class Spec, class Q, class K, class V, class O>
void topk_attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                    const View<O>& o, const TopkKeys& keys, const Options& options = {}) {
  select::check_gathered_spec<Spec>();
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  detail::check_topk_keys(keys, p, o);
  const Index group = p.q_heads / p.kv_heads, topk = keys.indices.dim;
  using N = typename Spec::Normalizer;
  constexpr bool kFast = std::is_same_v<typename Spec::Score, Dot> && std::is_same_v<N, Softmax>;
  constexpr bool kPerHead = detail::has_for_head<N>::value;
  const Index rows = kPerHead && !kFast ? 1 : group;  // heads a call
  const Index items = p.batch * p.q_len * p.kv_heads;
  struct Worker {
    detail::TopkSoftmax fast;
    select::GatheredRows<K> keys;
    select::GatheredRows<V> values;
    std::vector<Index> cols;
    std::vector<float> lse;
  };
  // Few items (decode, a shape rule): the softmax engine also splits each item's keys into
  // slices of kTopkSliceKeys entries, whose partial results are merged in order after, and
  // with fewer tasks than threads it splits a group's heads into at most G / 16 parts (rounded up).
  // Every head's bits are the same in any part, and the slices do not depend on the thread count.
  const Index threads = detail::thread_count(options.threads);
  const Index slices = kFast && items < detail::kTopkSliceBelow
                           ? (topk + detail::kTopkSliceKeys - 1) / detail::kTopkSliceKeys
                           : 1;
  const Index parts = kFast && items * slices < threads
                          ? std::clamp<Index>(threads / (items * slices), 1, (group + 15) / 16)
                          : 1;
  const Index per_part = (group + parts - 1) / parts;
  const detail::TopkPart block(per_part, p.value_dim);
  std::vector<float> partials(std::size_t(slices > 1 ? items * parts * slices * block.size() : 0));
  std::vector<Worker> pool(
      std::size_t(detail::threads_for(options.threads, items * parts * slices)));
  const auto heads_of = [&](Index item, Index part, Index& h0) {
    h0 = item % p.kv_heads * group + part * per_part;
    return std::min(per_part, (item % p.kv_heads + 1) * group - h0);
  };
  const auto lse_of = [&](Index item, Index h0) -> float* {
    const Index t = item / p.kv_heads % p.q_len, b = item / p.kv_heads / p.q_len;
    return options.lse.empty() ? nullptr : options.lse.data() + (b * p.q_heads + h0) * p.q_len + t;
  };
  const float* sinks = nullptr;
  if constexpr (kFast)
    if (!spec.normalizer.sinks.empty()) sinks = spec.normalizer.sinks.data();
  const auto worker = [&]() -> Worker& {  // this thread's
#ifdef _OPENMP
    return pool[std::size_t(omp_get_thread_num())];
#else
    return pool.front();
#endif
  };
  // Tasks handed out 4 at a time, or one at a time when there are few (decode's slices and
  // parts: 4 at a time had run them all on one thread).
  const Index tasks = items * parts * slices, chunk = tasks >= 16 * threads ? 4 : 1;
  detail::parallel_for(static_cast<int>(pool.size()), tasks, chunk, [&](Index task) {
    Worker& mine = worker();
    const Index item = task / slices / parts, part = task / slices % parts, slice = task % slices;
    const Index g = item % p.kv_heads, t = item / p.kv_heads % p.q_len,
                b = item / p.kv_heads / p.q_len;
    const std::int32_t* row = keys.indices.row(b, 0, t);
    float* lse = options.lse.empty() ? nullptr : options.lse.data();
    if constexpr (kFast) {
      Index h0 = 0;
      const Index heads = heads_of(item, part, h0);
      if (heads <= 0) return;
      if (slices == 1) {
        mine.fast.run(q, k, v, o, b, h0, t, heads, g, row, topk, p.scale,
                      sinks == nullptr ? nullptr : sinks + h0, lse_of(item, h0), p.q_len);
      } else {
        const Index first = slice * detail::kTopkSliceKeys;
        mine.fast.partial(q, k, v, b, h0, t, heads, g, row + first,
                          std::min(detail::kTopkSliceKeys, topk - first), p.scale,
                          partials.data() + task * block.size());
      }
      return;
    }
    mine.cols.clear();
    for (Index i = 0; i < topk; ++i)
      if (row[i] >= 0) mine.cols.push_back(row[i]);
    select::gather_rows(k, b, g, mine.cols, mine.keys);
    select::gather_rows(v, b, g, mine.cols, mine.values);
    for (Index h0 = g * group; h0 < (g + 1) * group; h0 += rows) {
      Options call = options.with_threads(1).with_q_offset(0);
      call.lse = {};
      if (lse != nullptr) {
        mine.lse.resize(std::size_t(rows));
        call.lse = Span<float>(mine.lse.data(), rows);
      }
      const AttentionSpec<typename Spec::Score, Full, N, NoPosition> call_spec{
          spec.score, Full{}, select::for_head(spec.normalizer, h0), {}};
      // The tiles, not split-KV: the call is one thread's, its rows a whole tile.
      const auto q_rows = detail::heads_as_rows(q, b, h0, t, rows);
      const auto o_rows = detail::heads_as_rows(o, b, h0, t, rows);
      const auto k_rows = mine.keys.view();
      const auto v_rows = mine.values.view();
      const Problem one = make_problem(q_rows, k_rows, v_rows, o_rows, call);
      detail::run_with_keys(call_spec, one, q_rows, k_rows, v_rows, o_rows, call, false);
      if (lse != nullptr)
        for (Index r = 0; r < rows; ++r)
          lse[(b * p.q_heads + h0 + r) * p.q_len + t] = mine.lse[std::size_t(r)];
    }
  });
  if (slices == 1) return;
  // The slices' partial results merged in order, per (item, part).
  detail::parallel_for(static_cast<int>(pool.size()), items * parts, 1, [&](Index task) {
    Worker& mine = worker();
    const Index item = task / parts, part = task % parts;
    Index h0 = 0;
    const Index heads = heads_of(item, part, h0);
    if (heads <= 0) return;
    const Index t = item / p.kv_heads % p.q_len, b = item / p.kv_heads / p.q_len;
    mine.fast.finish(partials.data() + task * slices * block.size(), slices, block.size(),
                     detail::TopkPart(heads, p.value_dim), sinks == nullptr ? nullptr : sinks + h0,
                     o, b, h0, t, lse_of(item, h0), p.q_len);
  });
}

}  // namespace attnkit
