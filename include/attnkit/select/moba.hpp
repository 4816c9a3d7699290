// MoBA, mixture of block attention (Lu et al. 2025, Moonshot; docs/mechanisms.md "MoBA"):
// keys are cut into blocks of `block` positions; query i scores block b by q_i . mean(K_b)
// and attends, causally, to the top-k blocks -- its own block always among them and counted
// toward k, future blocks never. route_topk_blocks() makes the routes (BlockRoutes);
// moba_attention() runs them the way MoBA's own implementation does, with the tiled kernel:
// the own blocks of all queries in one call (Causal & Chunked), then per (batch, head) and key
// block the queries that chose it gathered into one call over that block's keys, and every
// query's parts combined exactly by their LSE (kernel/merge.hpp). Each query pays only for
// its own k blocks: never for the union of its tile's choices.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/mask/causal.hpp"
#include "attnkit/mask/chunked.hpp"
#include "attnkit/mask/combine.hpp"
#include "attnkit/mask/full.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/options.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/score/softcap.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

/// The key blocks each (batch, query head, query row) attends to: ascending, the query's own
/// block floor((row + q_offset) / block) last. A row at a negative position chooses nothing.
/// The own block counts toward topk even when it holds no keys (a query placed past Lk).
struct BlockRoutes {
  Index batch = 0, heads = 0, q_len = 0, kv_len = 0, q_offset = 0, block = 1, topk = 1;
  std::vector<Index> blocks;  // [batch, heads, q_len, topk], the first count(...) of a row used
  std::vector<Index> counts;  // [batch, heads, q_len], 0 to topk

  struct List {  // the chosen blocks of one row, iterable
    const Index* first = nullptr;
    Index count = 0;
    const Index* begin() const { return first; }
    const Index* end() const { return first + count; }
    Index size() const { return count; }
    Index operator[](Index t) const { return first[t]; }
  };

  Index num_blocks() const { return (kv_len + block - 1) / block; }
  Index row(Index b, Index h, Index i) const { return (b * heads + h) * q_len + i; }
  /// The own block of query row i; negative for a negative position.
  Index own_block(Index i) const { return Chunked(block).chunk_begin(i + q_offset) / block; }
  List chosen(Index b, Index h, Index i) const {
    const Index r = row(b, h, i);
    return List{blocks.data() + r * topk, counts[static_cast<std::size_t>(r)]};
  }
};

/// Routes for q [B, Hq, Lq, D] over k [B, Hkv, Lk, D]: per query row, its own block and the
/// topk - 1 past blocks b < own with the highest q . mean(K_b) (K of the row's KV head; a
/// partial last block averages its actual keys). Scores in double; ties go to the lower block
/// index. q_offset places the queries (default Lk - Lq, as attention()). Throws Error first.
template <class Q, class K>
BlockRoutes route_topk_blocks(const View<Q>& q, const View<K>& k, Index block = 512, Index topk = 3,
                              std::optional<Index> q_offset = std::nullopt) {
  using detail::require;
  detail::check_view(q, "q");
  detail::check_view(k, "k");
  require(k.batch == q.batch, "k.batch", detail::cat("q.batch = ", q.batch), k.batch);
  require(k.dim == q.dim, "k.dim", detail::cat("q.dim = ", q.dim), k.dim);
  require(k.heads >= 1 && q.heads % k.heads == 0, "q.heads", "a multiple of k.heads", q.heads);
  require(block >= 1 && block <= (Index{1} << 60), "block", "1 to 2^60", block);
  require(topk >= 1, "topk", ">= 1", topk);
  Index cells = 0;
  require(detail::checked_product({q.batch, q.heads, q.seq, topk}, &cells), "topk",
          "small enough that [B, Hq, Lq, topk] fits in Index", topk);
  const Index offset = q_offset.value_or(k.seq - q.seq);
  require(offset >= -Problem::kMaxOffset && offset <= Problem::kMaxOffset, "q_offset",
          "within +-2^62", offset);

  BlockRoutes routes;
  routes.batch = q.batch, routes.heads = q.heads, routes.q_len = q.seq, routes.kv_len = k.seq;
  routes.q_offset = offset, routes.block = block, routes.topk = topk;
  routes.blocks.assign(static_cast<std::size_t>(cells), -1);
  routes.counts.assign(static_cast<std::size_t>(q.batch * q.heads * q.seq), 0);
  const Index n_blocks = routes.num_blocks(), dim = q.dim, group = q.heads / k.heads;
  std::vector<double> means(static_cast<std::size_t>(n_blocks * dim));  // [n_blocks, D]
  std::vector<double> score(static_cast<std::size_t>(n_blocks));        // one row's, [n_blocks]
  std::vector<Index> order(static_cast<std::size_t>(n_blocks));
  for (Index b = 0; b < q.batch; ++b)
    for (Index hk = 0; hk < k.heads; ++hk) {
      for (Index c = 0; c < n_blocks; ++c) {  // the block means, once per (batch, KV head)
        double* mean = means.data() + c * dim;
        const Index first = c * block, last = std::min(first + block, k.seq);
        std::fill(mean, mean + dim, 0.0);
        for (Index j = first; j < last; ++j)
          for (Index d = 0; d < dim; ++d) mean[d] += double(k.row(b, hk, j)[d]);
        for (Index d = 0; d < dim; ++d) mean[d] /= double(last - first);
      }
      for (Index h = hk * group; h < (hk + 1) * group; ++h)
        for (Index i = 0; i < q.seq; ++i) {
          const Index own = routes.own_block(i);
          if (own < 0) continue;  // before every key: nothing to see
          const Index past = std::min(own, n_blocks);
          const auto* qi = q.row(b, h, i);
          for (Index c = 0; c < past; ++c) {
            const double* mean = means.data() + c * dim;
            double dot = 0.0;
            for (Index d = 0; d < dim; ++d) dot += double(qi[d]) * mean[d];
            score[static_cast<std::size_t>(c)] = dot;
          }
          const Index keep = std::min(topk - 1, past);
          for (Index c = 0; c < past; ++c) order[static_cast<std::size_t>(c)] = c;
          const auto higher = [&](Index x, Index y) {
            const double sx = score[static_cast<std::size_t>(x)];
            const double sy = score[static_cast<std::size_t>(y)];
            return sx > sy || (sx == sy && x < y);
          };
          std::partial_sort(order.begin(), order.begin() + keep, order.begin() + past, higher);
          std::sort(order.begin(), order.begin() + keep);
          Index* out = routes.blocks.data() + routes.row(b, h, i) * topk;
          std::copy(order.begin(), order.begin() + keep, out);
          out[keep] = own;
          routes.counts[static_cast<std::size_t>(routes.row(b, h, i))] = keep + 1;
        }
    }
  return routes;
}

namespace detail {

// Throws Error unless `routes` were made for this call and every row's list is well formed:
// ascending past blocks that hold keys, then the own block (the gathered calls trust this).
inline void check_routes(const BlockRoutes& routes, const Problem& p, Index block) {
  require(routes.batch == p.batch && routes.heads == p.q_heads && routes.q_len == p.q_len &&
              routes.kv_len == p.kv_len,
          "BlockRoutes shape", "[batch, q_heads, Lq] and Lk of the call", "another shape");
  require(routes.q_offset == p.q_offset, "BlockRoutes.q_offset",
          detail::cat("the call's q_offset = ", p.q_offset), routes.q_offset);
  require(routes.block == block, "BlockRoutes.block", detail::cat("block = ", block), routes.block);
  Index cells = 0;  // [B, Hq, Lq] fits (make_problem checked the views), topk may not
  require(routes.topk >= 1 && checked_product({p.batch, p.q_heads, p.q_len, routes.topk}, &cells) &&
              routes.blocks.size() == static_cast<std::size_t>(cells) &&
              routes.counts.size() == static_cast<std::size_t>(p.batch * p.q_heads * p.q_len),
          "BlockRoutes sizes", "[B, Hq, Lq, topk] blocks and [B, Hq, Lq] counts", "others");
  const Index n_blocks = routes.num_blocks();
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h)
      for (Index i = 0; i < p.q_len; ++i) {
        const BlockRoutes::List list = routes.chosen(b, h, i);
        const Index own = routes.own_block(i);
        bool ok = own < 0 ? list.size() == 0
                          : list.size() >= 1 && list.size() <= routes.topk &&
                                list[list.size() - 1] == own;
        for (Index t = 0; ok && t + 1 < list.size(); ++t)
          ok = list[t] >= 0 && list[t] < std::min(own, n_blocks) &&
               (t == 0 || list[t - 1] < list[t]);
        require(ok, detail::cat("BlockRoutes row ", i, " of head ", h),
                "ascending past blocks, then the own block", "another list");
      }
}

}  // namespace detail

namespace select {

/// The checks moba_attention() and its backward add to the views': no sinks, a block size in
/// range, routes made for this call.
template <class Spec>
void check_moba_call(const Spec& spec, const Problem& p, const BlockRoutes& routes, Index block) {
  if constexpr (detail::has_sinks<typename Spec::Normalizer>::value)
    detail::require(spec.normalizer.sinks.empty(), "Softmax.sinks", "empty (no sinks in MoBA)",
                    "a sink per head");
  detail::require(block >= 1 && block <= (Index{1} << 60), "block", "1 to 2^60", block);
  detail::check_routes(routes, p, block);
}

/// A MoBA part's spec: the Score and normalizer of `spec` (no sinks) with `mask`.
template <class Spec, class Mask>
AttentionSpec<typename Spec::Score, Mask, typename Spec::Normalizer, NoPosition> moba_part(
    const Spec& spec, const Mask& mask) {
  return {spec.score, mask, spec.normalizer, {}};
}

/// The past-block parts of a MoBA call, in the order its forward and backward both take them:
/// per (batch, head) and past key block c that some rows chose, visit(b, h, c, rows, slots,
/// keys, values) with those rows (ascending), the slot of block c in each row's list, and
/// the block's keys and values (views of that block only); head_done(b, h) after each head.
template <class K, class V, class Visit, class HeadDone>
void for_each_moba_block(const Problem& p, const BlockRoutes& routes, Index block, const View<K>& k,
                         const View<V>& v, Visit&& visit, HeadDone&& head_done) {
  std::vector<std::vector<Index>> rows_of(static_cast<std::size_t>(routes.num_blocks()));
  std::vector<std::vector<Index>> slot_of(rows_of.size());
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.q_heads; ++h) {
      for (auto& r : rows_of) r.clear();
      for (auto& t : slot_of) t.clear();
      for (Index i = 0; i < p.q_len; ++i) {
        const BlockRoutes::List list = routes.chosen(b, h, i);
        for (Index t = 0; t + 1 < list.size(); ++t) {
          rows_of[static_cast<std::size_t>(list[t])].push_back(i);
          slot_of[static_cast<std::size_t>(list[t])].push_back(t);
        }
      }
      const Index hk = p.kv_head(h);
      for (std::size_t c = 0; c < rows_of.size(); ++c) {
        if (rows_of[c].empty()) continue;
        const Index first = static_cast<Index>(c) * block,
                    count = std::min(block, p.kv_len - first);
        View<K> keys = head_view(k, b, hk);  // [1, 1, count, D]: block c only
        View<V> values = head_view(v, b, hk);
        keys.data = keys.row(0, 0, first), keys.seq = count;
        values.data = values.row(0, 0, first), values.seq = count;
        visit(b, h, static_cast<Index>(c), rows_of[c], slot_of[c], keys, values);
      }
      head_done(b, h);
    }
}

}  // namespace select

/// o[B, Hq, Lq, Dv] = MoBA attention of q over k, v: row i of head h sees the keys j <= its
/// position in the blocks routes.chosen(b, h, i). Softmax without sinks only (Score Dot or
/// Softcap, Mask Full, NoPosition: the routes are the mask); options as for attention(),
/// options.lse receives the whole row's LSE. The result does not depend on options.threads.
/// Throws Error before writing anything when routes, block or inputs disagree.
template <class Spec, class Q, class K, class V, class O>
void moba_attention(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                    const View<O>& o, const BlockRoutes& routes, Index block = 512,
                    const Options& options = {}) {
  select::check_merged_spec<Spec>();
  const Problem p = make_problem(q, k, v, o, options);
  validate_policies(spec, p, options);
  select::check_moba_call(spec, p, routes, block);
  const Index rows_all = p.batch * p.q_heads * p.q_len, dv = p.value_dim;
  const Index others = routes.topk - 1;  // parts besides the own block, per row
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // 1. The own block of every query, in one call: causal inside the block.
  std::vector<float> own_out(static_cast<std::size_t>(rows_all * dv));  // [B, Hq, Lq, Dv]
  std::vector<float> own_lse(static_cast<std::size_t>(rows_all));       // [B, Hq, Lq]
  const View<float> own = bhsd(own_out.data(), p.batch, p.q_heads, p.q_len, dv);
  attention(select::moba_part(spec, Causal{} & Chunked{block}), q, k, v, own,
            options.with_q_offset(p.q_offset).with_lse(own_lse));

  // 2. Per (batch, head): slot t of a row holds its t-th past block (ascending), -inf LSE
  // where it chose fewer; each block's choosers run in one gathered call over its keys.
  std::vector<float> slot_out(static_cast<std::size_t>(others * p.q_len * dv), 0.f);  // [t, Lq, Dv]
  std::vector<float> slot_lse(static_cast<std::size_t>(others * p.q_len), kNegInf);   // [t, Lq]
  select::GatheredRows<Q> gathered;
  std::vector<float> part_out, part_lse;
  const auto run_block = [&](Index b, Index h, Index, const std::vector<Index>& rows,
                             const std::vector<Index>& slots, const View<K>& keys,
                             const View<V>& values) {
    const auto n = static_cast<Index>(rows.size());
    select::gather_rows(q, b, h, rows, gathered);
    part_out.resize(static_cast<std::size_t>(n * dv));
    part_lse.resize(static_cast<std::size_t>(n));
    attention(select::moba_part(spec, Full{}), gathered.view(), keys, values,
              bhsd(part_out.data(), 1, 1, n, dv), options.with_q_offset(0).with_lse(part_lse));
    for (Index r = 0; r < n; ++r) {  // row r of the call -> slot t of query rows[r]
      const Index t = slots[static_cast<std::size_t>(r)], i = rows[static_cast<std::size_t>(r)];
      std::copy_n(part_out.begin() + r * dv, dv, slot_out.begin() + (t * p.q_len + i) * dv);
      slot_lse[static_cast<std::size_t>(t * p.q_len + i)] = part_lse[static_cast<std::size_t>(r)];
    }
  };
  // 3. Merge in block order (the past blocks ascending, the own block last): fixed, whatever
  // the thread count. Empty parts (-inf) weigh 0; a row without keys stays 0.
  const auto merge_head = [&](Index b, Index h) {
    std::vector<View<const float>> parts;
    std::vector<const float*> stats;
    for (Index t = 0; t < others; ++t) {
      parts.push_back(
          bhsd(static_cast<const float*>(slot_out.data()) + t * p.q_len * dv, 1, 1, p.q_len, dv));
      stats.push_back(slot_lse.data() + t * p.q_len);
    }
    parts.push_back(select::head_view(View<const float>(own), b, h));
    stats.push_back(own_lse.data() + routes.row(b, h, 0));
    merge(spec.normalizer, parts, stats, select::head_view(o, b, h),
          options.lse.empty() ? Span<float>()
                              : Span<float>(options.lse.data() + routes.row(b, h, 0), p.q_len));
    std::fill(slot_out.begin(), slot_out.end(), 0.f);  // the next head starts empty
    std::fill(slot_lse.begin(), slot_lse.end(), kNegInf);
  };
  select::for_each_moba_block(p, routes, block, k, v, run_block, merge_head);
}

}  // namespace attnkit
