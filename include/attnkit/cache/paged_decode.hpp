// Decode over paged KV on the softmax row engine (kernel/decode/decode_rows.hpp): what
// attention_paged() runs for Lq <= kMaxDecodeQueries when the spec fits the engine. The items
// are (sequence, chunk of kDecodeChunk positions); an item hands the engine the chunk's keys
// page by page -- every KV group of a page in turn, so that a page is read whole and in
// order -- each run of rows read in place in the pool at its true positions (no Remapped
// mask, no copy). The chunks of a sequence merge in order: bitwise the same for any thread
// count, and -- with pages a multiple of kDecodeBlock positions -- the same blocks, so the
// same bits, as decode() on the contiguous sequence. Compared with one attention() call per
// page (the path of the other specs), there is no per-page call to pay.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/kernel/decode/decode_rows.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/kernel/split_kv.hpp"
#include "attnkit/options.hpp"
#include "attnkit/problem.hpp"

namespace attnkit {

template <class T>
class PagedKv;  // cache/paged_kv.hpp

namespace detail {

/// o[b] = merge() of sequence b's partial results: slots first_slot[b] .. first_slot[b + 1] - 1
/// of part_out [slots, Hq, Lq, Dv] and part_stat [slots, Hq * Lq] (empty: a normalizer
/// without row statistic), in slot order; lse, when not null, gets [B, Hq, Lq].
template <class N, class O>
void merge_sequences(const N& normalizer, const std::vector<float>& part_out,
                     const std::vector<float>& part_stat, const std::vector<Index>& first_slot,
                     const View<O>& o, Span<float> lse) {
  const Index Hq = o.heads, Lq = o.seq, Dv = o.dim, rows = Hq * Lq;
  for (std::size_t b = 0; b + 1 < first_slot.size(); ++b) {
    std::vector<View<const float>> parts;
    std::vector<const float*> stats;
    for (Index s = first_slot[b]; s < first_slot[b + 1]; ++s) {
      parts.push_back(bhsd(part_out.data() + s * rows * Dv, 1, Hq, Lq, Dv));
      if (!part_stat.empty()) stats.push_back(part_stat.data() + s * rows);
    }
    const Index bi = static_cast<Index>(b);
    const View<O> ob =
        strided(o.row(bi, 0, 0), {1, Hq, Lq, Dv}, {o.batch_stride, o.head_stride, o.seq_stride});
    merge(normalizer, parts, stats, ob,
          lse.empty() ? Span<float>() : Span<float>(lse.data() + bi * rows, rows));
  }
}

/// The Problem of attention_paged(q, paged, ..., options) but for the key count and query
/// offset, which are each sequence's own (kv_len and q_offset left 0).
template <class Q, class T>
Problem paged_problem(const View<Q>& q, const PagedKv<T>& paged, const Options& options) {
  Problem p;
  p.batch = paged.sequences();
  p.q_heads = q.heads;
  p.kv_heads = paged.kv_heads();
  p.q_len = q.seq;
  p.head_dim = q.dim;
  p.value_dim = paged.value_dim();
  p.scale = scale_for(options, q.dim);
  p.threads = options.threads;
  p.products = options.products;
  return p;
}

/// paged_decode_rows(spec, q, paged, o, options, q_offset): q_offset[b] is the position of sequence
/// b's first query row. Inputs and policies are validated by the caller (attention_paged(),
/// for each sequence).
template <class Spec, class Q, class T, class O>
void paged_decode_rows(const Spec& spec, const View<Q>& q, const PagedKv<T>& paged,
                       const View<O>& o, const Options& options,
                       const std::vector<Index>& q_offset) {
  const Index B = paged.sequences(), Hq = q.heads, Lq = q.seq, Dv = paged.value_dim();
  const Index Hkv = paged.kv_heads(), group = Hq / Hkv, rows = Hq * Lq;
  const Problem p = paged_problem(q, paged, options);

  // Items (b, c): chunk c of sequence b, every KV group, so that each page is read whole.
  // Sequence b's chunks are slots first_slot[b] .. first_slot[b + 1] - 1 (one for an empty
  // sequence: zero rows).
  std::vector<Index> first_slot(static_cast<std::size_t>(B) + 1, 0);
  for (Index b = 0; b < B; ++b)
    first_slot[static_cast<std::size_t>(b) + 1] =
        first_slot[static_cast<std::size_t>(b)] +
        std::max<Index>(1, (paged.length(b) + kDecodeChunk - 1) / kDecodeChunk);
  const Index slots = first_slot[static_cast<std::size_t>(B)];
  std::vector<float> part_out(static_cast<std::size_t>(slots * rows * Dv));
  std::vector<float> part_stat(static_cast<std::size_t>(slots * rows));

  using Engine = DecodeRows<Spec, Q, const T, const T>;
  Workers<Engine> engines(threads_for(options.threads, slots), spec, p, q, Hkv);
  for_each_item(engines, slots, [&](Engine& mine, Index slot) {
    const auto after = std::upper_bound(first_slot.begin(), first_slot.end(), slot);
    const Index b = (after - first_slot.begin()) - 1;
    const Index c = slot - first_slot[static_cast<std::size_t>(b)], P = paged.page_size();
    const Index end = std::min(paged.length(b), (c + 1) * kDecodeChunk);
    for (Index g = 0; g < Hkv; ++g) mine.begin(b, g, q_offset[static_cast<std::size_t>(b)]);
    // Rows [from, from + count) of the chunk's positions, every group, asked for ahead of use:
    // a page's successor is not next to it in memory, so no stream prefetcher finds it.
    const auto prefetch = [&](Index from, Index count) {
      for (Index at = from, stop = std::min(end, from + count); at < stop;) {
        const Index page = at / P, r = at - page * P, m = std::min(P - r, stop - at);
        const auto k = paged.sequence_keys(b, page);
        const auto v = paged.sequence_values(b, page);
        for (Index g = 0; g < Hkv; ++g)
          mine.prefetch(k.row(0, g, r), k.seq_stride, v.row(0, g, r), v.seq_stride, m);
        at += m;
      }
    };
    const Index start = c * kDecodeChunk;
    prefetch(start, Engine::kPrefetchKeys);
    for (Index pos = start; pos < end;) {  // page by page, every group
      const Index page = pos / P, r0 = pos - page * P, n = std::min(P - r0, end - pos);
      prefetch(pos + Engine::kPrefetchKeys, n);  // the rows kPrefetchKeys on, once each
      const auto k = paged.sequence_keys(b, page);
      const auto v = paged.sequence_values(b, page);
      for (Index g = 0; g < Hkv; ++g)
        mine.add_keys(b, g, k.row(0, g, r0), k.seq_stride, v.row(0, g, r0), v.seq_stride, pos, n);
      pos += n;
    }
    for (Index g = 0; g < Hkv; ++g) {
      const Index row = slot * rows + g * group * Lq;
      mine.finish(g, part_out.data() + row * Dv, part_stat.data() + row);
    }
  });

  merge_sequences(spec.normalizer, part_out, part_stat, first_slot, o, options.lse);
}

}  // namespace detail
}  // namespace attnkit
