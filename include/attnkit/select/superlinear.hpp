// Superlinear span attention (docs/mechanisms.md "Superlinear"): each query
// searches ~L^p anchor positions (p = 1/2), a routing query scores the key at each anchor,
// the top-k spans around the best anchors plus an optional local window are attended with an
// exact softmax: O(L^(1+p) d) for the search, O(L k span d) for the attention.
//   From the paper (as the seed states it): anchors ~L^p per query at stripe offsets
//     floor(m^(1/p)), a learned routing query (here an input) scoring them, top-k spans,
//     exact softmax over the spans, the optional window, the O(L^(3/2)) cost for p = 1/2.
//   A reading of the released code, not confirmed by the paper: the offsets count backward
//     from the query itself -- anchor a_m = i - floor(m^(1/p)), m = 1, 2, ... while a_m >= 0
//     -- so anchors (and spans) move with i; m starts at 1 (the query's own key is the window's).
//   Our choices: anchors per query, not per query block; a span is `span` keys centred on
//     its anchor, [a - span/2, a - span/2 + span), clipped causally; defaults topk = 8,
//     span = 64, window = 64 (about sqrt(L) / 3 spans at L = 32K); routing score
//     r_i . k_a in f32 on the query head's KV head, ties to the nearer anchor; overlapping
//     spans are merged, so a key counts once.
// Execution: per query, not per tile. Spans are relative to the query, so neighbouring
// queries' spans never coincide: at L = 32768 (defaults, random data, and routing queries
// that vary slowly) a 64-query tile's union of choices is 17x the keys its queries need
// (only 1.8x fewer logits than dense causal; at L = 4096 as many as dense). So each query
// attends to its own runs alone (select/detail/span_rows.hpp): scores by SIMD dot products,
// an exact softmax, P V -- its k * span + window keys, no more.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/select/detail/span_rows.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/select/superlinear_spans.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {
namespace detail {

// Throws Error unless `sel` was made for this call and every row's anchors are well formed:
// ascending, distinct, at most topk, inside [0, min(position, Lk - 1)] (the kernel trusts it).
inline void check_spans(const SpanSelection& sel, const Problem& p) {
  require(sel.batch == p.batch && sel.heads == p.q_heads && sel.q_len == p.q_len &&
              sel.kv_len == p.kv_len,
          "SpanSelection shape", "[batch, q_heads, Lq] and Lk of the call", "another shape");
  require(sel.q_offset == p.q_offset, "SpanSelection.q_offset",
          detail::cat("the call's q_offset = ", p.q_offset), sel.q_offset);
  require(sel.topk >= 1 && sel.span >= 1 && sel.span <= (Index{1} << 40) && sel.window >= 0 &&
              sel.window <= (Index{1} << 40),
          "SpanSelection topk / span / window", ">= 1 / 1 to 2^40 / 0 to 2^40", "others");
  Index cells = 0;  // [B, Hq, Lq] fits (make_problem checked the views), topk may not
  require(checked_product({p.batch, p.q_heads, p.q_len, sel.topk}, &cells) &&
              sel.anchors.size() == static_cast<std::size_t>(cells) &&
              sel.counts.size() == static_cast<std::size_t>(p.batch * p.q_heads * p.q_len),
          "SpanSelection sizes", "[B, Hq, Lq, topk] anchors and [B, Hq, Lq] counts", "others");
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h)
      for (Index i = 0; i < p.q_len; ++i) {
        const Index n = sel.count(b, h, i), last = std::min(i + p.q_offset, p.kv_len - 1);
        const Index* a = sel.chosen(b, h, i);
        bool ok = n >= 0 && n <= sel.topk;
        for (Index t = 0; ok && t < n; ++t)
          ok = a[t] >= 0 && a[t] <= last && (t == 0 || a[t - 1] < a[t]);
        require(ok, detail::cat("SpanSelection row ", i, " of head ", h),
                "ascending distinct anchors in [0, min(position, Lk - 1)]", "another list");
      }
}

inline float softcap_of(const Dot&) { return 0.f; }
inline float softcap_of(const Softcap& s) { return s.cap; }

}  // namespace detail

/// o[B, Hq, Lq, Dv] = Superlinear span attention of q over k, v: row i of head h sees the keys
/// of sel.runs(b, h, i) (its spans and window, j <= its position). Softmax without sinks
/// (Score Dot or Softcap, Mask Full, NoPosition: the spans are the mask); options as for
/// attention() (q_offset must be the selection's), options.lse receives each row's LSE. The
/// result does not depend on options.threads. Throws Error before writing anything.
template <class Spec, class Q, class K, class V, class O>
void superlinear_attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                           const View<O>& o, const SpanSelection& sel,
                           const Options& options = {}) {
  select::check_merged_spec<Spec>();
  static_assert(!std::is_const_v<O>, "superlinear_attention(): the output view must be writable");
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  if constexpr (detail::has_sinks<typename Spec::Normalizer>::value)
    detail::require(spec.normalizer.sinks.empty(), "Softmax.sinks", "empty (no sinks here)",
                    "a sink per head");
  detail::check_spans(sel, p);

  const detail::F32Rows4<K> keys(k);
  const detail::F32Rows4<V> values(v);
  const float softcap = detail::softcap_of(spec.score);
  // Keys of one row, at most (spans are merged and clipped to [0, Lk)), and its key runs (a
  // row's anchors are distinct keys: at most min(topk, Lk), then the window).
  const Index anchors = std::min(sel.topk, p.kv_len), max_runs = anchors + 1;
  Index capacity = 0;
  if (!detail::checked_mul(anchors, sel.span, &capacity) ||
      !detail::checked_add(capacity, sel.window, &capacity) || capacity > p.kv_len)
    capacity = p.kv_len;
  constexpr Index kChunk = 64;  // query rows per work item
  const Index chunks = (p.q_len + kChunk - 1) / kChunk, items = p.batch * p.q_heads * chunks;
  const int threads = detail::threads_for(p.threads, items);
  struct Scratch {  // one thread's, allocated before the parallel region
    detail::SpanScratch rows;
    std::vector<float> out;   // [Dv] one row's output in f32
    std::vector<Range> runs;  // [max_runs] one row's key runs
  };
  std::vector<Scratch> scratch;
  for (int t = 0; t < threads; ++t)
    scratch.push_back({detail::SpanScratch(capacity, p.head_dim, p.value_dim),
                       std::vector<float>(static_cast<std::size_t>(p.value_dim)),
                       std::vector<Range>(static_cast<std::size_t>(max_runs))});

  const auto run_item = [&](Scratch& mine, Index item) {
    const Index bh = item / chunks, i0 = item % chunks * kChunk, b = bh / p.q_heads,
                h = bh % p.q_heads, hk = p.kv_head(h);
    const auto key_row = [&](Index j) { return keys.row(b, hk, j); };
    const auto value_row = [&](Index j) { return values.row(b, hk, j); };
    float* qf = mine.rows.q.data();
    for (Index i = i0; i < std::min(i0 + kChunk, p.q_len); ++i) {
      const Q* src = q.row(b, h, i);
      for (Index c = 0; c < p.head_dim; ++c) qf[c] = static_cast<float>(src[c]) * p.scale;
      const int n = sel.runs(b, h, i, mine.runs.data());
      const float lse = detail::span_attend(qf, p.head_dim, mine.runs.data(), n, key_row, value_row,
                                            p.value_dim, softcap, mine.rows, mine.out.data());
      O* dst = o.row(b, h, i);
      for (Index c = 0; c < p.value_dim; ++c) dst[c] = static_cast<O>(mine.out[std::size_t(c)]);
      if (!options.lse.empty()) options.lse.data()[sel.row(b, h, i)] = lse;
    }
  };
  detail::for_each_item(scratch, items, run_item);
}

}  // namespace attnkit
