// Stripe sparsity (AnchorAttention, 2025; docs/mechanisms.md "Stripes"): the queries are cut into
// big blocks of block * step rows. Each query sees three regions: the initial tokens
// [0, init), its big block's local region (from `local` keys before the big block's first
// query up to the query itself, causal) and the kept columns of the middle region between
// them, chosen once per (batch, q head, big block) by anchor_stripes(). StripeSelection is
// that choice as data; stripe_attention() gathers each big block's columns and runs the tiled
// kernel on them under a Remapped causal mask; stripe_recall() measures what they hold.
// A gathered call's key count is the number of gathered columns: a normalizer that reads the
// call's Lk (Sigmoid{}'s default bias -log Lk) sees that count, not the whole sequence's; give
// such a normalizer its parameter explicitly (Sigmoid{b}). Softmax does not read it.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/options.hpp"
#include "attnkit/select/detail/stripe_scores.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// The paper's defaults: groups of 128 queries, 16 groups per big block (2048 queries),
/// theta = 12 (natural-log units: a column is kept when its pooled logit is within theta of
/// the pooled anchor), the first block of keys as initial tokens, no local keys before the
/// big block (local = the big block's own causal region, the paper's diagonal).
struct StripeParams {
  Index block = 128;   // queries pooled together (mean) for the selection
  Index step = 16;     // groups per big block
  float theta = 12.f;  // margin in natural-log units; +inf keeps every column
  Index init = 128;    // initial tokens [0, init) are always attended
  Index local = 0;     // keys before the big block's first query that are always attended

  Index big_block() const { return block * step; }
};

/// The kept middle columns per (batch, q head, big block), in CSR form, with the shape of
/// the call they were chosen for. Regions of big block g (absolute key positions):
///   init    [0, init_end())
///   middle  [init_end(), local_begin(g)): only `kept(b, h, g)` are attended
///   local   [max(local_begin(g), init_end()), i] for the query at position i (causal)
struct StripeSelection {
  StripeParams params;
  Index batch = 0, q_heads = 0, q_len = 0, kv_len = 0, q_offset = 0;
  std::vector<Index> offsets;  // [batch * q_heads * big_blocks() + 1]
  std::vector<Index> columns;  // kept middle columns, ascending within each big block

  Index big_blocks() const { return (q_len + params.big_block() - 1) / params.big_block(); }
  Index item(Index b, Index h, Index g) const { return (b * q_heads + h) * big_blocks() + g; }
  /// Query rows of big block g.
  Range rows(Index g) const {
    return {g * params.big_block(), std::min(q_len, (g + 1) * params.big_block())};
  }
  Index init_end() const { return std::clamp<Index>(params.init, 0, kv_len); }
  Index local_begin(Index g) const {
    return std::clamp<Index>(q_offset + rows(g).begin - params.local, 0, kv_len);
  }
  Range middle(Index g) const { return {init_end(), std::max(init_end(), local_begin(g))}; }
  /// The kept middle columns of (b, h, g): [first, last).
  const Index* kept_begin(Index b, Index h, Index g) const {
    return columns.data() + offsets[std::size_t(item(b, h, g))];
  }
  const Index* kept_end(Index b, Index h, Index g) const {
    return columns.data() + offsets[std::size_t(item(b, h, g) + 1)];
  }

  /// Every key column a query of (b, h, g) may see, ascending: init, kept, local.
  std::vector<Index> gathered_columns(Index b, Index h, Index g) const {
    std::vector<Index> out;
    for (Index j = 0; j < init_end(); ++j) out.push_back(j);
    out.insert(out.end(), kept_begin(b, h, g), kept_end(b, h, g));
    const Index last = q_offset + rows(g).end;  // one past the big block's last query
    for (Index j = middle(g).end; j < std::min(last, kv_len); ++j) out.push_back(j);
    return out;
  }

  /// The element rule (absolute positions, as a Mask's keep()): query i sees key j.
  bool keep(Index b, Index h, Index i, Index j) const {
    if (j > i || j < 0 || j >= kv_len) return false;
    const Index g = (i - q_offset) / params.big_block();
    const Range mid = middle(g);
    if (j < mid.begin || j >= mid.end) return true;
    return std::binary_search(kept_begin(b, h, g), kept_end(b, h, g), j);
  }

  /// Kept middle columns over all middle columns (1 when there is no middle region).
  double kept_fraction() const {
    double middle_total = 0;
    for (Index g = 0; g < big_blocks(); ++g)
      middle_total += double(batch * q_heads) * double(middle(g).end - middle(g).begin);
    return middle_total == 0 ? 1.0 : double(columns.size()) / middle_total;
  }

  /// One line per big block of (b, h): its rows, regions and kept columns (up to `shown`).
  std::string to_string(Index b, Index h, Index shown = 16) const {
    std::string s;
    for (Index g = 0; g < big_blocks(); ++g) {
      const Range mid = middle(g);
      const Index n = kept_end(b, h, g) - kept_begin(b, h, g);
      s += "rows [" + std::to_string(rows(g).begin) + ", " + std::to_string(rows(g).end) +
           "): init [0, " + std::to_string(init_end()) + "), middle [" + std::to_string(mid.begin) +
           ", " + std::to_string(mid.end) + ") kept " + std::to_string(n) + ":";
      for (Index c = 0; c < std::min(n, shown); ++c)
        s += " " + std::to_string(kept_begin(b, h, g)[c]);
      s += n > shown ? " ...\n" : "\n";
    }
    return s;
  }

  /// Throws Error unless this selection is well formed and made for a call of this shape.
  void validate(Index b, Index hq, Index lq, Index lk, Index offset) const {
    using detail::require;
    require(batch == b && q_heads == hq && q_len == lq && kv_len == lk, "StripeSelection shape",
            "[batch, q_heads, Lq, Lk] of the call", "another shape");
    require(q_offset == offset, "StripeSelection.q_offset", offset, q_offset);
    require(params.block >= 1 && params.step >= 1, "StripeParams block, step", ">= 1",
            std::min(params.block, params.step));
    require(Index(offsets.size()) == batch * q_heads * big_blocks() + 1 && offsets[0] == 0 &&
                offsets.back() == Index(columns.size()),
            "StripeSelection.offsets", "batch * q_heads * big_blocks + 1 entries over columns",
            offsets.size());
    for (Index it = 0; it + 1 < Index(offsets.size()); ++it) {
      const Range mid = middle(it % big_blocks());
      require(offsets[std::size_t(it)] <= offsets[std::size_t(it + 1)], "StripeSelection.offsets",
              "non-decreasing", offsets[std::size_t(it + 1)]);
      for (Index c = offsets[std::size_t(it)]; c < offsets[std::size_t(it + 1)]; ++c) {
        const Index j = columns[std::size_t(c)];
        require(j >= mid.begin && j < mid.end &&
                    (c == offsets[std::size_t(it)] || j > columns[std::size_t(c - 1)]),
                "StripeSelection.columns", "ascending columns of the middle region", j);
      }
    }
  }
};

/// The paper's selection for q [B, Hq, Lq, D] over k [B, Hkv, Lk, D] (GQA: the query head's
/// KV head). (1) anchor a_i = max of scale q_i . k_j over init and local keys j <= i;
/// (2) per big block, q and a averaged over each group of `block` rows (the last group may
/// be short); middle column j is kept when some group has scale q_bar . k_j + theta >= a_bar.
/// options: scale, q_offset (default Lk - Lq, bottom-right), threads.
template <class Q, class K>
StripeSelection anchor_stripes(const View<Q>& q, const View<K>& k, const StripeParams& params = {},
                               const Options& options = {}) {
  const detail::StripeProblem p = detail::stripe_problem(q, k, params, options);
  StripeSelection sel;
  sel.params = params;
  sel.batch = p.batch;
  sel.q_heads = p.q_heads;
  sel.q_len = p.q_len;
  sel.kv_len = p.kv_len;
  sel.q_offset = p.q_offset;
  const Index groups = sel.big_blocks(), items = p.batch * p.q_heads * groups;
  std::vector<std::vector<Index>> kept(static_cast<std::size_t>(items));
  detail::parallel_for(detail::threads_for(options.threads, items), items, 1, [&](Index it) {
    const Index g = it % groups, bh = it / groups;
    detail::select_stripes(q, k, p, params, bh / p.q_heads, bh % p.q_heads, sel.rows(g),
                           sel.middle(g), kept[std::size_t(it)]);
  });
  sel.offsets.assign(1, 0);
  for (const auto& cols : kept) {
    sel.columns.insert(sel.columns.end(), cols.begin(), cols.end());
    sel.offsets.push_back(Index(sel.columns.size()));
  }
  return sel;
}

namespace select {

/// Rows [rows.begin, rows.end) of head h in batch b of `view`, in place: one big block.
template <class T>
View<T> block_rows(const View<T>& view, Index b, Index h, Range rows) {
  View<T> one = head_view(view, b, h);
  one.data = view.row(b, h, rows.begin);
  one.seq = rows.end - rows.begin;
  return one;
}

/// The parts of a stripe_attention() call, in the order its forward and backward both take
/// them: per (batch, head, big block), visit(b, h, rows, cols, part, call) with the block's
/// query rows (contiguous), its gathered key columns, the part's spec (the Score and the
/// head's normalizer, Causal Remapped to the rows' and columns' true positions) and the
/// options of its call (q_offset 0, the statistic at the block's rows).
template <class Spec, class Visit>
void for_each_stripe_part(const Spec& spec, const Problem& p, const StripeSelection& selection,
                          const Options& options, Visit&& visit) {
  std::vector<Index> positions;  // [rows of the big block]: true query positions
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h)
      for (Index g = 0; g < selection.big_blocks(); ++g) {
        const Range rows = selection.rows(g);
        const std::vector<Index> cols = selection.gathered_columns(b, h, g);
        positions.resize(std::size_t(rows.end - rows.begin));
        for (Index r = rows.begin; r < rows.end; ++r)
          positions[std::size_t(r - rows.begin)] = r + p.q_offset;
        const AttentionSpec<typename Spec::Score, Remapped<Causal>, typename Spec::Normalizer,
                            NoPosition>
            part{spec.score,
                 remap(Causal{}, positions.data(), cols.data(), Index(cols.size())),
                 for_head(spec.normalizer, h),
                 {}};
        Options call = options.with_q_offset(0);
        if (!options.lse.empty())
          call.lse = Span<float>(options.lse.data() + (b * p.q_heads + h) * p.q_len + rows.begin,
                                 rows.end - rows.begin);
        visit(b, h, rows, cols, part, call);
      }
}

}  // namespace select

/// o[B, Hq, Lq, Dv] = attention of q over the columns `selection` gives each query (init,
/// kept, local; causal), for q, k, v, o as in attention(). The spec gives the Score (Dot or
/// Softcap) and Normalizer (its Mask must be Full, its Position NoPosition); options as for
/// attention() and as when the selection was made (the same q_offset). Throws before writing
/// anything.
template <class Spec, class Q, class K, class V, class O>
void stripe_attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                      const View<O>& o, const StripeSelection& selection,
                      const Options& options = {}) {
  select::check_gathered_spec<Spec>();
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  selection.validate(p.batch, p.q_heads, p.q_len, p.kv_len, p.q_offset);
  if (p.kv_len == 0) return attention(spec, q, k, v, o, options);  // no key, no column

  select::GatheredRows<K> keys;
  select::GatheredRows<V> values;
  select::for_each_stripe_part(spec, p, selection, options,
                               [&](Index b, Index h, Range rows, const std::vector<Index>& cols,
                                   const auto& part, const Options& call) {
                                 select::gather_rows(k, b, p.kv_head(h), cols, keys);
                                 select::gather_rows(v, b, p.kv_head(h), cols, values);
                                 // The big block's rows are contiguous: the call reads and writes
                                 // them in place.
                                 attention(part, select::block_rows(q, b, h, rows), keys.view(),
                                           values.view(), select::block_rows(o, b, h, rows), call);
                               });
}

/// How much of the full causal softmax mass of each query the selection keeps: per row,
/// sum of softmax weights (scale q . k over every key j <= i) on the columns the selection
/// gives it; rows that see no key count as 1. per_row is [B, Hq, Lq]; mean and min over
/// rows. A dense O(Lq Lk D) diagnostic in double (the paper's recall), not a fast path.
struct StripeRecall {
  std::vector<double> per_row;  // [batch, q_heads, q_len]
  double mean = 1.0, min = 1.0;
};

template <class Q, class K>
StripeRecall stripe_recall(const View<Q>& q, const View<K>& k, const StripeSelection& selection,
                           const Options& options = {}) {
  const detail::StripeProblem p = detail::stripe_problem(q, k, selection.params, options);
  selection.validate(p.batch, p.q_heads, p.q_len, p.kv_len, p.q_offset);
  StripeRecall out;
  out.per_row.assign(std::size_t(p.batch * p.q_heads * p.q_len), 1.0);
  const Index rows = p.batch * p.q_heads * p.q_len;
  detail::parallel_for(detail::threads_for(options.threads, rows), rows, 16, [&](Index row) {
    const Index r = row % p.q_len, bh = row / p.q_len, b = bh / p.q_heads, h = bh % p.q_heads;
    const Index i = r + p.q_offset;
    out.per_row[std::size_t(row)] = detail::recall_of_row(
        q.row(b, h, r), k, p, b, [&](Index j) { return selection.keep(b, h, i, j); }, h, i);
  });
  double total = 0;
  for (const double x : out.per_row) {
    total += x;
    out.min = std::min(out.min, x);
  }
  out.mean = rows == 0 ? 1.0 : total / double(rows);
  return out;
}

}  // namespace attnkit
