// BlockColumns<N>: a BlockMask of narrow key blocks -- a few keys each, or single keys: the
// pattern of token-level selection (the keys a router or a top-k picks per query block, a
// pattern read from a file) -- with the gathered-columns face (mask/key_columns.hpp). Such
// blocks are scattered: a 64-key tile over them is Partial and its pairs are looked up one by
// one. Through the face each query's kept keys are its columns, at most N of them, and the
// kernel gathers them: into dense key tiles where the queries of a tile share them (query
// blocks of 8 rows or more), row by row where they do not. The plan (kernel/tiles/tile_plan.hpp)
// still compares that with walking the blocks.
//
//   const auto blocks = ak::make_block_mask(picked, q_len, kv_len, /*block_q=*/16, /*block_k=*/1);
//   const auto spec = ak::make_spec(ak::block_columns<512>(blocks));  // BlockColumns<512, ..>
//
// Every face of the BlockMask stays (keep, classify, its key ranges, validate); the range
// part is NoKeys: every kept key is a column.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/mask/block_mask.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_ranges.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

/// The range part of a mask whose kept keys are all columns: no key at all.
struct NoKeys {
  using slot = MaskSlot;
  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const { return false; }
  KeyRanges<1> key_ranges(Index /*b*/, Index /*h*/, Range /*q*/) const { return {}; }
};

template <int N, class Rule = KeepAll>
class BlockColumns {
 public:
  using slot = MaskSlot;

  /// Throws Error unless N holds every query's keys: block_k times the most key blocks
  /// (full and partial) that one query block lists.
  explicit BlockColumns(BlockMask<Rule> blocks) : blocks_(std::move(blocks)) {
    const BlockMaskLayout& l = blocks_.layout();
    const BlockList &full = blocks_.full_blocks(), &partial = blocks_.partial_blocks();
    Index most = 0;
    for (std::size_t r = 0; r + 1 < full.offsets.size(); ++r)
      most = std::max(most, full.offsets[r + 1] - full.offsets[r] + partial.offsets[r + 1] -
                                partial.offsets[r]);
    const Index keys = std::min(most * l.block_k, l.kv_len);  // at most kv_blocks * block_k
    detail::require(keys <= N, "BlockColumns: N",
                    detail::cat(">= the most keys a query block lists = ", keys), N);
  }

  const BlockMask<Rule>& blocks() const { return blocks_; }

  bool keep(Index b, Index h, Index i, Index j) const { return blocks_.keep(b, h, i, j); }
  TileKind classify(Index b, Index h, Range q, Range kv) const {
    return blocks_.classify(b, h, q, kv);
  }
  template <class Visit>
  void for_each_key_range(Index b, Index h, Range q, Visit&& visit) const {
    blocks_.for_each_key_range(b, h, q, std::forward<Visit>(visit));
  }
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    blocks_.validate(q_len, kv_len, q_offset, batch, q_heads);
  }

  /// No key comes in a range.
  NoKeys range_part() const { return {}; }

  /// Query i's kept keys, ascending: every key of its query block's full blocks, and the keys
  /// of its partial blocks that the element rule keeps.
  KeyColumns<N> columns(Index b, Index h, Index i) const {
    KeyColumns<N> c;
    const BlockMaskLayout& l = blocks_.layout();
    const Index row = i - l.q_offset;
    if (row < 0 || row >= l.q_len) return c;
    const auto r = static_cast<std::size_t>((b * l.heads + (l.heads == 1 ? 0 : h)) * l.q_blocks() +
                                            row / l.block_q);
    const BlockList &full = blocks_.full_blocks(), &partial = blocks_.partial_blocks();
    Index x = full.offsets[r], y = partial.offsets[r];
    const Index x_end = full.offsets[r + 1], y_end = partial.offsets[r + 1];
    while (x < x_end || y < y_end) {  // the two sorted lists, merged
      const bool is_full =
          y == y_end || (x < x_end && full.blocks[static_cast<std::size_t>(x)] <
                                          partial.blocks[static_cast<std::size_t>(y)]);
      const Index kb = is_full ? full.blocks[static_cast<std::size_t>(x++)]
                               : partial.blocks[static_cast<std::size_t>(y++)];
      const Index end = std::min(l.kv_len, (kb + 1) * l.block_k);
      for (Index j = kb * l.block_k; j < end; ++j)
        if (is_full || blocks_.rule().keep(b, h, i, j)) c.add(j);
    }
    return c;
  }

 private:
  BlockMask<Rule> blocks_;
};

/// BlockColumns<N, Rule> of `blocks`, its rule's type deduced.
template <int N, class Rule>
BlockColumns<N, Rule> block_columns(BlockMask<Rule> blocks) {
  return BlockColumns<N, Rule>(std::move(blocks));
}

}  // namespace attnkit
