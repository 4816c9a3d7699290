// The span search of Superlinear attention (select/superlinear.hpp has the mechanism, its
// sources and which parts are readings): SuperlinearParams, the SpanSelection data format
// (per query row: the chosen anchors, and the key runs they make with the local window) and
// superlinear_spans(), which scores ~L^p anchors per query with a routing query.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/select/detail/span_rows.hpp"

namespace attnkit {

struct SuperlinearParams {
  double p = 0.5;     // anchors at offsets floor(m^(1/p)) back from the query, m = 1, 2, ...
  Index topk = 8;     // spans kept per query
  Index span = 64;    // span width: keys [a - span/2, a - span/2 + span) around anchor a
  Index window = 64;  // the last `window` keys up to the query, always kept; 0: none
};

/// Anchor offsets floor(m^(1/p)) for m = 1, 2, ... while <= max_offset (strictly increasing:
/// m^(1/p) grows by >= 1 per step for p <= 1). 1/p integral (p = 1/2) is computed exactly.
inline std::vector<Index> anchor_offsets(double p, Index max_offset) {
  std::vector<Index> offsets;
  const double e = 1.0 / p;
  const bool integral = std::abs(e - std::round(e)) < 1e-9;
  for (Index m = 1;; ++m) {
    double off = 1.0;
    if (integral)
      for (long t = 0; t < std::lround(e) && off <= double(max_offset); ++t) off *= double(m);
    else
      off = std::floor(std::pow(double(m), e));
    if (off > double(max_offset)) return offsets;
    offsets.push_back(static_cast<Index>(off));
  }
}

/// The spans chosen for each (batch, query head, query row): anchor key positions,
/// ascending; row i (position i + q_offset) sees its spans and its window, causally.
struct SpanSelection {
  Index batch = 0, heads = 0, q_len = 0, kv_len = 0, q_offset = 0;
  Index topk = 1, span = 1, window = 0;
  std::vector<Index> anchors;  // [batch, heads, q_len, topk], the first count of a row used
  std::vector<Index> counts;   // [batch, heads, q_len], 0 to topk

  Index row(Index b, Index h, Index i) const { return (b * heads + h) * q_len + i; }
  Index count(Index b, Index h, Index i) const {
    return counts[static_cast<std::size_t>(row(b, h, i))];
  }
  const Index* chosen(Index b, Index h, Index i) const {
    return anchors.data() + row(b, h, i) * topk;
  }
  /// The keys of the span around anchor a (before causal clipping).
  Range span_of(Index a) const { return {a - span / 2, a - span / 2 + span}; }
  /// The key runs row i sees, written to out[topk + 1]: its spans and window clipped to
  /// [0, min(position + 1, kv_len)), merged, ascending and disjoint. Returns their count.
  int runs(Index b, Index h, Index i, Range* out) const {
    const Index pos = i + q_offset, end = std::min(pos + 1, kv_len);
    if (end <= 0) return 0;
    int n = 0;
    const auto add = [&](Range r) {
      r = {std::max<Index>(r.begin, 0), std::min(r.end, end)};
      if (r.end <= r.begin) return;
      if (n > 0 && r.begin <= out[n - 1].end)
        out[n - 1].end = std::max(out[n - 1].end, r.end);
      else
        out[n++] = r;
    };
    const Range local{pos - window + 1, pos + 1};
    const Index* a = chosen(b, h, i);
    bool local_added = window == 0;
    for (Index t = 0; t < count(b, h, i); ++t) {  // span begins ascend with the anchors
      if (!local_added && local.begin <= span_of(a[t]).begin) add(local), local_added = true;
      add(span_of(a[t]));
    }
    if (!local_added) add(local);
    return n;
  }
};

/// Spans for routing queries r [B, Hq, Lq, D] over keys k [B, Hkv, Lk, D]: per query row at
/// position i, the anchors a = i - floor(m^(1/p)) in [0, Lk) are scored by r_i . k_a (K of
/// the row's KV head, f32) and the top params.topk kept (ties: the nearer anchor).
/// options.q_offset places the queries (default Lk - Lq), options.threads as attention().
/// Throws Error before computing anything on bad input.
template <class R, class K>
SpanSelection superlinear_spans(const View<R>& routing_q, const View<K>& k,
                                const SuperlinearParams& params = {}, const Options& options = {}) {
  using detail::require;
  detail::check_view(routing_q, "routing_q");
  detail::check_view(k, "k");
  const View<R>& r = routing_q;
  require(k.batch == r.batch, "k.batch", detail::cat("routing_q.batch = ", r.batch), k.batch);
  require(k.dim == r.dim, "k.dim", detail::cat("routing_q.dim = ", r.dim), k.dim);
  require(k.heads >= 1 && r.heads % k.heads == 0, "routing_q.heads", "a multiple of k.heads",
          r.heads);
  require(params.p > 0.0 && params.p <= 1.0, "SuperlinearParams.p", "in (0, 1]", params.p);
  Index cells = 0;
  require(
      params.topk >= 1 && detail::checked_product({r.batch, r.heads, r.seq, params.topk}, &cells),
      "SuperlinearParams.topk", ">= 1, small enough that [B, Hq, Lq, topk] fits in Index",
      params.topk);
  require(params.span >= 1 && params.span <= (Index{1} << 40), "SuperlinearParams.span",
          "1 to 2^40", params.span);
  require(params.window >= 0 && params.window <= (Index{1} << 40), "SuperlinearParams.window",
          "0 to 2^40", params.window);
  require(options.threads >= 0 && options.threads <= Options::kMaxThreads, "threads",
          detail::cat("0 (all) to ", Options::kMaxThreads), options.threads);
  const Index offset = options.q_offset.value_or(k.seq - r.seq);
  require(offset >= -Problem::kMaxOffset && offset <= Problem::kMaxOffset, "q_offset",
          "within +-2^62", offset);

  SpanSelection sel;
  sel.batch = r.batch, sel.heads = r.heads, sel.q_len = r.seq, sel.kv_len = k.seq;
  sel.q_offset = offset, sel.topk = params.topk, sel.span = params.span;
  sel.window = params.window;
  sel.anchors.assign(static_cast<std::size_t>(cells), -1);
  sel.counts.assign(static_cast<std::size_t>(r.batch * r.heads * r.seq), 0);
  const Index last_pos = offset + r.seq - 1;  // the farthest anchor is at most this far back
  const std::vector<Index> offsets = anchor_offsets(params.p, std::max<Index>(last_pos, 0));
  const detail::F32Rows4<K> keys(k);
  const Index group = r.heads / std::max<Index>(k.heads, 1), dim = r.dim;

  constexpr Index kChunk = 64;  // query rows per work item
  const Index chunks = (r.seq + kChunk - 1) / kChunk, items = r.batch * r.heads * chunks;
  const int threads = detail::threads_for(options.threads, items);
  struct Scratch {                // one thread's, allocated before the parallel region
    std::vector<float> score, q;  // [anchors]: one row's scores; [D]: its routing row in f32
    std::vector<Index> order;     // [anchors]: candidate indices m - 1
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(threads));
  for (Scratch& s : scratch) {
    s.score.resize(offsets.size()), s.q.resize(static_cast<std::size_t>(dim));
    s.order.reserve(offsets.size());
  }
  const auto run_item = [&](Scratch& mine, Index item) {
    const Index bh = item / chunks, i0 = item % chunks * kChunk, b = bh / r.heads, h = bh % r.heads,
                hk = h / group;
    const float* score = mine.score.data();
    float* qf = mine.q.data();
    std::vector<Index>& order = mine.order;
    for (Index i = i0; i < std::min(i0 + kChunk, r.seq); ++i) {
      const Index pos = i + offset;
      const R* src = r.row(b, h, i);
      for (Index c = 0; c < dim; ++c) qf[c] = static_cast<float>(src[c]);
      order.clear();  // candidates m - 1 whose anchor holds a key, nearest first
      for (std::size_t m = 0; m < offsets.size() && offsets[m] <= pos; ++m) {
        const Index a = pos - offsets[m];
        if (a >= k.seq) continue;
        mine.score[m] = simd::dot(qf, keys.row(b, hk, a), dim);
        order.push_back(static_cast<Index>(m));
      }
      const auto keep =
          static_cast<std::ptrdiff_t>(std::min<Index>(params.topk, Index(order.size())));
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](Index x, Index y) {
        return score[x] > score[y] || (score[x] == score[y] && x < y);
      });
      Index* out = sel.anchors.data() + sel.row(b, h, i) * params.topk;
      for (std::size_t t = 0; t < std::size_t(keep); ++t)
        out[t] = pos - offsets[static_cast<std::size_t>(order[t])];
      std::sort(out, out + keep);
      sel.counts[static_cast<std::size_t>(sel.row(b, h, i))] = keep;
    }
  };
  detail::for_each_item(scratch, items, run_item);
  return sel;
}

}  // namespace attnkit
