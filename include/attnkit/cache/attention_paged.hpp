// attention_paged(spec, q, paged, o, options): attention of q over the sequences of a
// PagedKv (cache/paged_kv.hpp, which includes this header), reading the pages in place:
// softmax decode on the row engine (cache/paged_decode.hpp), every other spec as one
// attention() call per page, the parts merged in page order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/cache/paged_decode.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/kernel/attention.hpp"
#include "attnkit/kernel/merge.hpp"
#include "attnkit/kernel/split_kv.hpp"
#include "attnkit/mask/remap.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/normalizer/sigmoid.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/normalizer/softplus_l1.hpp"
#include "attnkit/options.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/spec.hpp"

namespace attnkit {

template <class T>
class PagedKv;  // cache/paged_kv.hpp

namespace detail {

// What the pages of one sequence (length kv_len, query rows at q_offset + r) know of it, for
// the normalizer they run with (KeyPart): they run as a call of their own, rows b * Hq * Lq
// on of the call's, each row's visible keys counted over the whole sequence.
template <class Mask>
KeyPart page_part(const Mask& mask, Index b, Index q_heads, Index q_len, Index kv_len,
                  Index q_offset) {
  return KeyPart::own(kv_len, b * q_heads * q_len, q_heads * q_len, [=, &mask] {
    return visible_key_counts(remap(mask, nullptr, nullptr, 0, b), 1, q_heads, q_len, kv_len,
                              q_offset);
  });
}

}  // namespace detail

// attention_paged(spec, q, paged, o, options) reads the pages in place, never gathering a
// sequence first, in one of two ways:
// - Softmax decode (q_len <= kMaxDecodeQueries, a spec the row engine takes: see
//   decode_rows_fit() in kernel/decode/decode_rows.hpp) runs cache/paged_decode.hpp: split-KV
//   items (sequence, 512-position chunk) hand the row engine each page's rows in place, at
//   their true positions, every KV group of a page in turn; no call per page. With 16-key
//   pages it takes 1.3-1.5x the time of decode() on contiguous K/V with GQA (Hkv 8), 1.0x
//   without (bench_decode, AVX-512; with K/V in cache 64-key pages cost 1.05x).
// - Everything else: for sequence b and the p-th page of its block table, K and V are
//   strided views of that page in the pool (no copy) and one attention() call gives a partial
//   result and row statistic; the call's mask sees true key positions through Remapped
//   (k_positions = page start + j, pointers into one shared iota array; query rows at their
//   true positions q_offset_b + r), so every mask behaves as on the contiguous sequence.
// Either way merge() then combines the parts of each sequence in order -- exact (merge() is
// exact for one-pass normalizers), and independent of the thread count.
//
// Cost of the per-page path. Decode-sized calls (q_len <= kMaxDecodeQueries) run the
// (sequence, page) items in parallel, one OpenMP loop over all of them, with threads = 1
// inside each attention() call: a page is the split-KV chunk. Larger calls run the items one
// after another, each attention() call using the requested threads. The price of reading in
// place is: scratch of pages_b x Hq x Lq x (Dv + 1) floats per sequence for the partial
// results (for prefill that is pages_b times the output: small pages and long prompts make
// it large -- prefill wants pages of 256 keys or more), one merge per row in f64 over its
// pages (O(pages x Dv) per row), and one kernel call per page (its fixed setup cost: with
// 16-key pages, softmax decode this way took 10x the contiguous time, hence the row engine
// path above). Compared with gathering, no K/V byte is copied: decode reads every K/V byte
// once.
//
// Positions: score mods and Position policies would see page-local indices, so the spec must
// be position-free: no Position (store keys rotated: KvCache's way 1, queries turned by
// apply_position at their positions) and no Alibi (static_assert); a user's own score mod
// that reads positions sees page-local ones.

/// o[B, Hq, Lq, Dv] = attention of q[B, Hq, Lq, D] over the sequences of `paged` (B =
/// paged.sequences(); sequence b has its own length Lk_b), read page by page in place (see
/// above). Query row r of sequence b is at position options.q_offset + r, by default
/// Lk_b - Lq + r (the queries are the sequence's last tokens). options.lse receives
/// [B, Hq, Lq] row statistics. A sequence of length 0 gives zero rows (the empty statistic).
/// Throws Error before writing anything on bad shapes, overlapping buffers or a policy whose
/// data does not fit a sequence.
template <class Spec, class Q, class T, class O>
void attention_paged(const Spec& spec, const View<Q>& q, const PagedKv<T>& paged, const View<O>& o,
                     const Options& options = {}) {
  using Normalizer = typename Spec::Normalizer;
  static_assert(!std::is_const_v<O>, "attention_paged(): the output view must be writable");
  static_assert(detail::passes<Normalizer>() == 1,
                "attention_paged(): this normalizer makes more than one pass over the keys "
                "(LSSAR): its pages cannot be merged in one round");
  check_index_free_spec<Spec>();
  using detail::require;
  using detail::require_dim;
  detail::check_view(q, "q");
  detail::check_view(o, "o");
  detail::check_rows_distinct(o, "o");
  const Index B = paged.sequences(), Hq = q.heads, Lq = q.seq, Dv = paged.value_dim();
  require_dim(q.batch, B, "q.batch", "PagedKv.sequences()");
  require_dim(q.dim, paged.head_dim(), "q.dim", "PagedKv.head_dim");
  require(Hq >= 1 && Hq % paged.kv_heads() == 0, "q.heads",
          detail::cat("a multiple of PagedKv.kv_heads = ", paged.kv_heads()), Hq);
  require_dim(o.batch, B, "o.batch", "q.batch");
  require_dim(o.heads, Hq, "o.heads", "q.heads");
  require_dim(o.seq, Lq, "o.seq", "q.seq");
  require_dim(o.dim, Dv, "o.dim", "PagedKv.value_dim");
  const detail::ByteSpan out_span = detail::byte_span(o);
  detail::require_disjoint(out_span, "o", detail::byte_span(q), "q");
  for (Index b = 0; b < B; ++b)
    for (Index pg = 0; pg < static_cast<Index>(paged.block_table(b).size()); ++pg) {
      detail::require_disjoint(out_span, "o", detail::byte_span(paged.sequence_keys(b, pg)),
                               "the pool");
      detail::require_disjoint(out_span, "o", detail::byte_span(paged.sequence_values(b, pg)),
                               "the pool");
    }
  constexpr bool kStat = detail::row_stat_kind<Normalizer>() != RowStat::None;
  require(kStat || options.lse.empty(), "lse", "nullptr (this normalizer has no row statistic)",
          "a buffer");
  detail::require_span_size(options.lse, B * Hq * Lq, "Options.lse.size()",
                            "q.batch * q.heads * q.seq: one statistic per query row");
  if (!options.lse.empty() && B * Hq * Lq > 0) {
    const auto begin = reinterpret_cast<std::uintptr_t>(options.lse.data());
    const detail::ByteSpan lse_span{
        begin, begin + static_cast<std::uintptr_t>(B * Hq * Lq) * sizeof(float)};
    detail::require_disjoint(out_span, "o", lse_span, "options.lse");
    detail::require_disjoint(detail::byte_span(q), "q", lse_span, "options.lse");
  }
  if constexpr (detail::has_sinks<Normalizer>::value)
    require(spec.normalizer.sinks.empty() || static_cast<Index>(spec.normalizer.sinks.size()) == Hq,
            "Softmax.sinks.size()", detail::cat("q.heads = ", Hq), spec.normalizer.sinks.size());

  // Query offsets per sequence (checked below with each sequence's Problem).
  std::vector<Index> q_off(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b)
    q_off[static_cast<std::size_t>(b)] =
        options.q_offset ? *options.q_offset : paged.length(b) - Lq;
  // Each policy checks its data against every sequence, with the sequence's own length and
  // query offset, on both paths below (a BlockMask laid out for other sizes is refused).
  const Problem whole = detail::paged_problem(q, paged, options);
  for (Index b = 0; b < B; ++b) {
    Problem pb = whole;
    pb.kv_len = paged.length(b);
    pb.q_offset = q_off[static_cast<std::size_t>(b)];
    pb.validate();
    validate_policies(spec, pb, options);
  }
  if (B * Hq * Lq == 0) return;  // after the checks: an empty call refuses what others refuse
  if constexpr (detail::decode_rows_fit<Spec>()) {  // softmax decode: no call per page
    if (Lq <= kMaxDecodeQueries)
      return detail::paged_decode_rows(spec, q, paged, o, options, q_off);
  }
  // The true positions the per-page calls' Remapped masks read: every key position of the
  // longest sequence, and each sequence's Lq query positions. Sized by the data, never by
  // the query offset (a valid offset of 2^62 would otherwise ask for 2^62 entries).
  Index longest = 0;
  for (Index b = 0; b < B; ++b) longest = std::max(longest, paged.length(b));
  std::vector<Index> key_pos(static_cast<std::size_t>(longest));
  for (Index j = 0; j < longest; ++j) key_pos[static_cast<std::size_t>(j)] = j;
  std::vector<Index> query_pos(static_cast<std::size_t>(B * Lq));
  for (Index b = 0; b < B; ++b)
    for (Index r = 0; r < Lq; ++r)  // |q_offset| <= 2^62 (validated): no overflow
      query_pos[static_cast<std::size_t>(b * Lq + r)] = q_off[static_cast<std::size_t>(b)] + r;

  // The items: (sequence, page), each with its slot of partial results.
  struct Item {
    Index b, page, slot;
  };
  std::vector<Item> items;
  std::vector<Index> first_slot(static_cast<std::size_t>(B) + 1, 0);
  for (Index b = 0; b < B; ++b) {
    const Index n = static_cast<Index>(paged.block_table(b).size());
    for (Index pg = 0; pg < n; ++pg)
      items.push_back({b, pg, first_slot[static_cast<std::size_t>(b)] + pg});
    first_slot[static_cast<std::size_t>(b) + 1] =
        first_slot[static_cast<std::size_t>(b)] + std::max<Index>(n, 1);
  }
  const Index slots = first_slot[static_cast<std::size_t>(B)], part_rows = Hq * Lq;
  std::vector<float> part_out(static_cast<std::size_t>(slots * part_rows * Dv), 0.f);
  std::vector<float> part_stat(kStat ? static_cast<std::size_t>(slots * part_rows) : 0,
                               detail::row_stat_kind<Normalizer>() == RowStat::Sum
                                   ? 0.f
                                   : -std::numeric_limits<float>::infinity());

  const bool parallel = Lq <= kMaxDecodeQueries;
  const int threads =
      parallel ? detail::threads_for(options.threads, static_cast<Index>(items.size())) : 1;
  std::vector<Normalizer> norms;  // per sequence, before any thread starts
  norms.reserve(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b)
    norms.push_back(detail::part_normalizer(spec.normalizer,
                                            detail::page_part(spec.mask, b, Hq, Lq, paged.length(b),
                                                              q_off[static_cast<std::size_t>(b)])));
  const auto run_item = [&](const Item& it) {
    const View<const T> k = paged.sequence_keys(it.b, it.page);
    const View<const T> v = paged.sequence_values(it.b, it.page);
    using Mask = typename Spec::Mask;
    const auto remapped = remap(spec.mask, query_pos.data() + it.b * Lq,
                                key_pos.data() + it.page * paged.page_size(), k.seq, it.b);
    const AttentionSpec<typename Spec::Score, Remapped<Mask>, Normalizer, NoPosition> call_spec{
        spec.score, remapped, norms[static_cast<std::size_t>(it.b)], NoPosition{}};
    const View<const Q> qb = strided(static_cast<const Q*>(q.row(it.b, 0, 0)), {1, Hq, Lq, q.dim},
                                     {q.batch_stride, q.head_stride, q.seq_stride});
    float* out = part_out.data() + it.slot * part_rows * Dv;
    Options call = options.with_q_offset(0).with_threads(parallel ? 1 : options.threads);
    call.lse = kStat ? Span<float>(part_stat.data() + it.slot * part_rows, part_rows) : nullptr;
    attention(call_spec, qb, k, v, bhsd(out, 1, Hq, Lq, Dv), call);
  };

  // attention() may throw (std::bad_alloc): parallel_for rethrows it after the loop.
  detail::parallel_for(threads, static_cast<Index>(items.size()), 1,
                       [&](Index i) { run_item(items[static_cast<std::size_t>(i)]); });

  detail::merge_sequences(spec.normalizer, part_out, part_stat, first_slot, o, options.lse);
}

}  // namespace attnkit