// How a sequence of L positions is split across P ranks for ring (context-parallel)
// attention, and the helpers that copy a whole sequence's rows to one rank's shard and back.
//   Contiguous: rank r holds [r L / P, (r + 1) L / P).
//   Zigzag:     the sequence is cut into 2P chunks c = [c L / 2P, (c + 1) L / 2P), and rank r
//               holds chunks r and 2P - 1 - r. Under a causal mask every rank then has the
//               same number of visible pairs (up to rounding), so no rank waits for the last.
// Positions stay global: a shard's rows are the sequence's rows at shard_positions(), in
// ascending order. This header needs no MPI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit::dist {

enum class Layout { Contiguous, Zigzag };

inline const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "Contiguous";
    case Layout::Zigzag:
      return "Zigzag";
  }
  return "not a Layout";
}

/// Throws Error (naming `argument`) unless layout is one of the enumerators.
template <class Argument>
void check_layout(Layout layout, const Argument& argument) {
  detail::require(layout == Layout::Contiguous || layout == Layout::Zigzag, argument,
                  "Layout::Contiguous or Layout::Zigzag",
                  detail::cat("Layout(", static_cast<int>(layout), ")"));
}

/// The ranges of global positions rank `rank` of `ranks` holds of a sequence of `len`
/// positions, ascending (one range, or two for Zigzag). Throws Error for a layout that is not
/// an enumerator, len < 0, ranks < 1 or a rank outside [0, ranks).
inline std::vector<Range> shard_ranges(Layout layout, Index len, int rank, int ranks) {
  check_layout(layout, "shard_ranges(): layout");
  detail::require(len >= 0, "shard_ranges(): len", ">= 0", len);
  detail::require(ranks >= 1, "shard_ranges(): ranks", ">= 1", ranks);
  detail::require(rank >= 0 && rank < ranks, "shard_ranges(): rank",
                  detail::cat("in [0, ", ranks, ")"), rank);
  const Index p = ranks, r = rank;
  // len * (p + 1) cannot overflow for any realistic len: len < 2^62 / 2p is checked here.
  detail::require(len <= (Index{1} << 61) / (2 * p), "shard_ranges(): len",
                  "small enough that len * 2 * ranks fits in Index", len);
  if (layout == Layout::Contiguous) return {Range{r * len / p, (r + 1) * len / p}};
  const auto chunk = [&](Index c) { return Range{c * len / (2 * p), (c + 1) * len / (2 * p)}; };
  return {chunk(r), chunk(2 * p - 1 - r)};
}

/// The global positions of rank `rank`'s rows, ascending.
inline std::vector<Index> shard_positions(Layout layout, Index len, int rank, int ranks) {
  std::vector<Index> out;
  for (const Range& range : shard_ranges(layout, len, rank, ranks))
    for (Index i = range.begin; i < range.end; ++i) out.push_back(i);
  return out;
}

/// Rows a rank holds (the length of its shard).
inline Index shard_length(Layout layout, Index len, int rank, int ranks) {
  Index n = 0;
  for (const Range& range : shard_ranges(layout, len, rank, ranks)) n += range.end - range.begin;
  return n;
}

namespace impl {

// The rows of rank `rank`'s shard between a whole sequence's view and the shard's: to the
// shard (kToShard: shard_rows) or back (unshard_rows), after the shapes' check.
template <bool kToShard, class F, class S>
void copy_shard_rows(const View<F>& full, const View<S>& shard, Layout layout, int rank, int ranks,
                     const char* what) {
  detail::check_view(full, "full");
  detail::check_view(shard, "shard");
  const std::vector<Index> at = shard_positions(layout, full.seq, rank, ranks);
  detail::require(
      shard.batch == full.batch && shard.heads == full.heads && shard.dim == full.dim &&
          shard.seq == static_cast<Index>(at.size()),
      detail::cat(what, ": shard"),
      detail::cat("[", full.batch, ", ", full.heads, ", ", at.size(), ", ", full.dim, "]"),
      detail::cat("[", shard.batch, ", ", shard.heads, ", ", shard.seq, ", ", shard.dim, "]"));
  const Index e = detail::row_elements<F>(full.dim);
  for (Index b = 0; b < full.batch; ++b)
    for (Index h = 0; h < full.heads; ++h)
      for (std::size_t s = 0; s < at.size(); ++s) {
        const Index i = static_cast<Index>(s);
        if constexpr (kToShard)
          std::copy(full.row(b, h, at[s]), full.row(b, h, at[s]) + e, shard.row(b, h, i));
        else
          std::copy(shard.row(b, h, i), shard.row(b, h, i) + e, full.row(b, h, at[s]));
      }
}

}  // namespace impl

/// shard[b, h, s] = full[b, h, positions[s]] for rank `rank`'s positions: the rows of a
/// whole sequence's view (seq = len) copied to the rank's shard (seq = shard_length()).
/// Throws Error when the shapes disagree.
template <class T, class U>
void shard_rows(const View<T>& full, Layout layout, int rank, int ranks, const View<U>& shard) {
  static_assert(!std::is_const_v<U>, "shard_rows(): the shard view must be writable");
  impl::copy_shard_rows<true>(full, shard, layout, rank, ranks, "shard_rows()");
}

/// The inverse: full[b, h, positions[s]] = shard[b, h, s] (the other rows of full untouched),
/// so every rank's shard_rows() output put back gives the whole sequence.
template <class T, class U>
void unshard_rows(const View<T>& shard, Layout layout, int rank, int ranks, const View<U>& full) {
  static_assert(!std::is_const_v<U>, "unshard_rows(): the full view must be writable");
  impl::copy_shard_rows<false>(full, shard, layout, rank, ranks, "unshard_rows()");
}

}  // namespace attnkit::dist
