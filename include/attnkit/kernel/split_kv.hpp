// Split-KV: the engine of decode(). A few query rows (Lq <= kMaxDecodeQueries) against a long
// KV give one query tile per head: the prefill kernel would keep one thread per (batch,
// head). Here the keys are cut into chunks of kDecodeChunk, the items are (batch, KV head,
// chunk), shared by the threads; each item runs the query rows of its KV group over the same
// chunk (its K and V stay in cache: one read from memory per group) -- on the row engine
// (decode_rows.hpp) for softmax specs with up to kDecodeRowsMaxQueries rows per head, else on
// query tiles, head after head -- giving each row a partial result and row statistic; merge()
// then combines the chunks of each row in chunk order. Chunking does not depend on the thread
// count, so the output is bitwise identical for any number of threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/decode/decode_rows.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/kernel/tiles/attention_tiles.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/problem.hpp"

namespace attnkit {

/// Keys per split-KV chunk, and the most query rows decode() takes.
inline constexpr Index kDecodeChunk = 512;
inline constexpr Index kMaxDecodeQueries = 16;

namespace detail {

// Item `item` of a split-KV call: batch b, KV head g and chunk c (the fastest), whose keys
// are [c * kDecodeChunk, min(kv_len, (c + 1) * kDecodeChunk)).
struct SplitItem {
  Index b, g, c;
  Range keys;
};
inline SplitItem split_item(const Problem& p, Index chunks, Index item) {
  const Index c = item % chunks, bg = item / chunks;
  return {bg / p.kv_heads, bg % p.kv_heads, c,
          Range{c * kDecodeChunk, std::min(p.kv_len, (c + 1) * kDecodeChunk)}};
}

// The split-KV items on AttentionTiles (any one-pass spec): each item runs the query heads of
// its KV group one after another over its chunk.
template <class Spec, class Q, class K, class V, class O>
void run_split_kv_tiles(const Spec& part_spec, const Problem& p, const View<Q>& q, const View<K>& k,
                        const View<V>& v, const View<O>& o, Index chunks, float* part_out,
                        float* part_stat) {
  using Normalizer = typename Spec::Normalizer;
  using Tiles = AttentionTiles<Spec, Q, K, V, O>;
  constexpr bool kStat = row_stat_kind<Normalizer>() != RowStat::None;
  const Index group = p.q_heads / p.kv_heads, rows = p.batch * p.q_heads * p.q_len;
  const Index items = p.batch * p.kv_heads * chunks;
  std::vector<float> key_scale;  // cosine logits (SoftplusL1): the key norms, once per call
  if constexpr (cosine_logits<Normalizer>()) key_scale = inverse_row_norms(k);
  const int threads = threads_for(p.threads, items);
  Workers<Tiles> tiles(threads, part_spec, p, q, k, v, o, nullptr, key_scale.data());

  const auto run_item = [&](Tiles& mine, Index item) {
    const SplitItem it = split_item(p, chunks, item);
    for (Index h = it.g * group; h < (it.g + 1) * group; ++h) {
      const Index row = (it.b * p.q_heads + h) * p.q_len;
      mine.run_part(it.b, h, 0, p.q_len, it.keys, part_out + (it.c * rows + row) * p.value_dim,
                    p.value_dim, kStat ? part_stat + it.c * rows + row : nullptr);
    }
  };
  for_each_item(tiles, items, run_item);
}

/// The split-KV kernel on validated inputs (Lq <= kMaxDecodeQueries).
template <class Spec, class Q, class K, class V, class O>
void run_split_kv(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                  const View<V>& v, const View<O>& o, float* lse) {
  using Normalizer = typename Spec::Normalizer;
  static_assert(passes<Normalizer>() == 1,
                "decode(): this normalizer makes more than one pass over the keys (LSSAR): its "
                "chunks cannot be merged in one round; use attention()");

  const Index chunks = std::max<Index>(1, (p.kv_len + kDecodeChunk - 1) / kDecodeChunk);
  const Index group = p.q_heads / p.kv_heads, rows = p.batch * p.q_heads * p.q_len;
  const Index items = p.batch * p.kv_heads * chunks;
  if (rows == 0) return;
  constexpr bool kStat = row_stat_kind<Normalizer>() != RowStat::None;
  // Every item writes all its rows' outputs and statistics: no zero-fill.
  const std::unique_ptr<float[]> part_out(
      new float[static_cast<std::size_t>(chunks * rows * p.value_dim)]);
  const std::unique_ptr<float[]> part_stat(
      new float[kStat ? static_cast<std::size_t>(chunks * rows) : 0]);

  bool rows_engine = false;
  if constexpr (decode_rows_fit<Spec>()) rows_engine = p.q_len <= kDecodeRowsMaxQueries;
  if (rows_engine) {
    // Softmax rows: a whole KV group per item, keys in the lanes (decode_rows.hpp).
    Workers<DecodeRows<Spec, Q, K, V>> engines(threads_for(p.threads, items), spec, p, q);
    for_each_item(engines, items, [&](DecodeRows<Spec, Q, K, V>& mine, Index item) {
      const SplitItem it = split_item(p, chunks, item);
      const Index row = (it.b * p.q_heads + it.g * group) * p.q_len;
      mine.run(it.b, it.g, k, v, it.keys, part_out.get() + (it.c * rows + row) * p.value_dim,
               part_stat.get() + it.c * rows + row);
    });
  } else {
    Spec part_spec = spec;
    part_spec.normalizer = part_normalizer(spec.normalizer, KeyPart::inside(p.kv_len));
    run_split_kv_tiles(part_spec, p, q, k, v, o, chunks, part_out.get(), part_stat.get());
  }

  std::vector<View<const float>> parts;
  std::vector<const float*> stats;
  for (Index c = 0; c < chunks; ++c) {
    parts.push_back(bhsd(static_cast<const float*>(part_out.get()) + c * rows * p.value_dim,
                         p.batch, p.q_heads, p.q_len, p.value_dim));
    if (kStat) stats.push_back(part_stat.get() + c * rows);
  }
  merge(spec.normalizer, parts, stats, o, Span<float>(lse, p.batch * p.q_heads * p.q_len));
}

}  // namespace detail
}  // namespace attnkit
