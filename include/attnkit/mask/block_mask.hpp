// BlockMask: a data mask over blocks of query rows x blocks of keys, stored like a BCSR
// matrix. Users build it from their own data (document packing, routing, a pattern read from
// a file) or from any element mask with make_block_mask(). The kernel visits only listed
// blocks, never calls keep() on full ones, and masks partial ones with the element rule.
//
// The format. Query rows (0 .. q_len-1, absolute position row + q_offset) are cut into
// blocks of block_q rows, keys into blocks of block_k keys. For each (batch, head, query
// block) -- "head" is 0 for a mask shared by every head (heads = 1) -- two sorted lists of
// key-block indices: `full` blocks (every pair kept) and `partial` blocks (pairs decided by
// the element rule; without one, every pair of a partial block is kept). Row r of the BCSR
// arrays is ((b * heads + h) * q_blocks + qb); row r's blocks are
// blocks[offsets[r] .. offsets[r+1]). Any block size >= 1 works; 64-row and 256-key
// multiples line up with the kernel's tiles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/slots.hpp"
#include "attnkit/detail/policy_tag.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/tile_kind.hpp"

namespace attnkit {

/// The sizes a BlockMask is laid out for; attention() checks them against the call.
struct BlockMaskLayout {
  Index batch = 1, heads = 1;  // heads = 1: one pattern shared by every query head
  Index q_len = 0, kv_len = 0;
  Index block_q = 128, block_k = 128;
  Index q_offset = 0;  // absolute position of query row 0 (attention()'s q_offset)

  Index q_blocks() const { return q_len / block_q + (q_len % block_q != 0); }  // no overflow
  Index kv_blocks() const { return kv_len / block_k + (kv_len % block_k != 0); }
  Index rows() const { return batch * heads * q_blocks(); }
};

namespace detail {

inline void check_block_layout(const BlockMaskLayout& l) {
  require(l.batch >= 0, "BlockMask.batch", ">= 0", l.batch);
  require(l.heads >= 1, "BlockMask.heads", ">= 1", l.heads);
  require(l.q_len >= 0, "BlockMask.q_len", ">= 0", l.q_len);
  require(l.kv_len >= 0, "BlockMask.kv_len", ">= 0", l.kv_len);
  require(l.block_q >= 1, "BlockMask.block_q", ">= 1", l.block_q);
  require(l.block_k >= 1, "BlockMask.block_k", ">= 1", l.block_k);
  Index rows = 0;
  require(checked_product({l.batch, l.heads, l.q_blocks()}, &rows) && rows < (Index{1} << 40),
          "BlockMask", "batch * heads * q_blocks below 2^40", "more");
}

}  // namespace detail

/// The element rule of a BlockMask without one: a partial block keeps every pair.
struct KeepAll {
  bool keep(Index /*b*/, Index /*h*/, Index /*i*/, Index /*j*/) const { return true; }
};

/// BCSR lists of one kind of block: row r holds blocks[offsets[r] .. offsets[r + 1]).
struct BlockList {
  std::vector<Index> offsets;  // [rows + 1]
  std::vector<Index> blocks;   // key-block indices, sorted within each row
};

template <class Rule = KeepAll>
class BlockMask {
 public:
  using slot = MaskSlot;

  /// This mask's identity: its layout, block lists and element rule (detail/policy_tag.hpp).
  std::uint64_t tag() const {
    const Data& d = *data_;
    const BlockMaskLayout& l = d.layout;
    return detail::TagHash::of<BlockMask>()
        .add(l.batch)
        .add(l.heads)
        .add(l.q_len)
        .add(l.kv_len)
        .add(l.block_q)
        .add(l.block_k)
        .add(l.q_offset)
        .add(d.partial.offsets)
        .add(d.partial.blocks)
        .add(d.full.offsets)
        .add(d.full.blocks)
        .add(detail::policy_tag(rule_))
        .value();
  }

  /// Validates everything (sizes, offsets, sorted and in-range indices, a block never both
  /// full and partial) and throws Error naming the first problem.
  BlockMask(const BlockMaskLayout& layout, BlockList partial, BlockList full, Rule rule = {})
      : data_(std::make_shared<Data>(Data{layout, std::move(partial), std::move(full)})),
        rule_(std::move(rule)) {
    detail::check_block_layout(layout);
    check_list(data_->partial, "partial");
    check_list(data_->full, "full");
    check_disjoint();
  }

  const BlockMaskLayout& layout() const { return data_->layout; }
  const BlockList& partial_blocks() const { return data_->partial; }
  const BlockList& full_blocks() const { return data_->full; }
  const Rule& rule() const { return rule_; }

  bool keep(Index b, Index h, Index i, Index j) const {
    const Layout& l = data_->layout;
    const Index row = i - l.q_offset;
    if (row < 0 || row >= l.q_len || j < 0 || j >= l.kv_len) return false;
    const Index r = bcsr_row(b, h, row / l.block_q), kb = j / l.block_k;
    if (listed(data_->full, r, kb)) return true;
    return listed(data_->partial, r, kb) && rule_.keep(b, h, i, j);
  }

  /// Full when every (query block, key block) pair the tile covers is listed full, Empty
  /// when none is listed, Partial otherwise (exact at block granularity).
  TileKind classify(Index b, Index h, Range q, Range kv) const {
    const Layout& l = data_->layout;
    const Range rows = query_blocks(q), cols{kv.begin / l.block_k, kv.last() / l.block_k + 1};
    bool any = false, all_full = true;
    for (Index qb = rows.begin; qb < rows.end; ++qb) {
      const Index r = bcsr_row(b, h, qb);
      for (Index kb = cols.begin; kb < cols.end; ++kb) {
        const bool full = listed(data_->full, r, kb);
        any = any || full || listed(data_->partial, r, kb);
        all_full = all_full && full;
      }
    }
    return !any ? TileKind::Empty : all_full ? TileKind::Full : TileKind::Partial;
  }

  /// Calls visit(Range keys) for each maximal run of consecutive key blocks listed for some
  /// query block of q, in key order (the kernel's key schedule for data masks).
  template <class Visit>
  void for_each_key_range(Index b, Index h, Range q, Visit&& visit) const {
    const Layout& l = data_->layout;
    const Range rows = query_blocks(q);
    Index run_begin = -1, run_end = -1;  // current run of key blocks [begin, end)
    for (Index kb = next_listed(b, h, rows, 0); kb >= 0; kb = next_listed(b, h, rows, kb + 1)) {
      if (kb != run_end) {
        if (run_begin >= 0) visit(Range{run_begin * l.block_k, run_end * l.block_k});
        run_begin = kb;
      }
      run_end = kb + 1;
    }
    if (run_begin >= 0) visit(Range{run_begin * l.block_k, run_end * l.block_k});
  }

  /// attention() calls this: the layout must match the call's sizes and q_offset.
  void validate(Index q_len, Index kv_len, Index q_offset, Index batch, Index q_heads) const {
    const Layout& l = data_->layout;
    detail::require(l.q_len == q_len, "BlockMask.q_len", q_len, l.q_len);
    detail::require(l.kv_len == kv_len, "BlockMask.kv_len", kv_len, l.kv_len);
    detail::require(l.q_offset == q_offset, "BlockMask.q_offset", q_offset, l.q_offset);
    detail::require(l.batch == batch, "BlockMask.batch", batch, l.batch);
    detail::require(l.heads == 1 || l.heads == q_heads, "BlockMask.heads",
                    detail::cat("1 (shared) or q_heads = ", q_heads), l.heads);
  }

  /// Fraction of (query block, key block) pairs that are not listed: the work skipped.
  double sparsity() const {
    const Layout& l = data_->layout;
    const double pairs = double(l.rows()) * double(l.kv_blocks());
    const double listed_pairs = double(data_->partial.blocks.size() + data_->full.blocks.size());
    return pairs > 0 ? 1.0 - listed_pairs / pairs : 0.0;
  }

  /// The block pattern of (b, h), one text line per query block: '#' full, '+' partial,
  /// '.' skipped (FlexAttention's BlockMask.to_string, in ASCII).
  std::string to_string(Index b = 0, Index h = 0) const {
    check_batch_head(b, h);
    const Layout& l = data_->layout;
    std::string out;
    for (Index qb = 0; qb < l.q_blocks(); ++qb) {
      const Index r = bcsr_row(b, h, qb);
      for (Index kb = 0; kb < l.kv_blocks(); ++kb)
        out += listed(data_->full, r, kb) ? '#' : listed(data_->partial, r, kb) ? '+' : '.';
      out += '\n';
    }
    return out;
  }

  /// The dense [q_len, kv_len] pattern of (b, h): 1 where the pair is kept.
  std::vector<char> to_dense(Index b = 0, Index h = 0) const {
    check_batch_head(b, h);
    const Layout& l = data_->layout;
    std::vector<char> dense(static_cast<std::size_t>(l.q_len * l.kv_len));
    for (Index row = 0; row < l.q_len; ++row)
      for (Index j = 0; j < l.kv_len; ++j)
        dense[static_cast<std::size_t>(row * l.kv_len + j)] = keep(b, h, row + l.q_offset, j);
    return dense;
  }

 private:
  using Layout = BlockMaskLayout;
  struct Data {
    Layout layout;
    BlockList partial, full;
  };

  // The debugging faces take (b, h) from users; the kernel's come validated.
  void check_batch_head(Index b, Index h) const {
    const Layout& l = data_->layout;
    detail::require(b >= 0 && b < l.batch, "BlockMask: b", detail::cat("in [0, ", l.batch, ")"), b);
    detail::require(
        h >= 0 && (l.heads == 1 || h < l.heads), "BlockMask: h",
        l.heads == 1 ? std::string(">= 0 (shared)") : "in [0, " + std::to_string(l.heads) + ")", h);
  }

  Index bcsr_row(Index b, Index h, Index qb) const {
    const Layout& l = data_->layout;
    return ((b * l.heads + (l.heads == 1 ? 0 : h)) * l.q_blocks()) + qb;
  }

  // The query blocks holding the rows of absolute positions q (clipped to [0, q_len)).
  Range query_blocks(Range q) const {
    const Layout& l = data_->layout;
    const Index first = std::clamp<Index>(q.begin - l.q_offset, 0, l.q_len);
    const Index last = std::clamp<Index>(q.last() - l.q_offset, 0, l.q_len - 1);
    if (l.q_len == 0 || q.last() - l.q_offset < 0 || first >= l.q_len) return {0, 0};
    return {first / l.block_q, last / l.block_q + 1};
  }

  static bool listed(const BlockList& list, Index r, Index kb) {
    const auto begin = list.blocks.begin() + list.offsets[static_cast<std::size_t>(r)];
    const auto end = list.blocks.begin() + list.offsets[static_cast<std::size_t>(r + 1)];
    return std::binary_search(begin, end, kb);
  }

  // The smallest key block >= from listed (full or partial) for a query block in `rows`;
  // -1 when there is none.
  Index next_listed(Index b, Index h, Range rows, Index from) const {
    Index best = -1;
    for (Index qb = rows.begin; qb < rows.end; ++qb) {
      const Index r = bcsr_row(b, h, qb);
      for (const BlockList* list : {&data_->full, &data_->partial}) {
        const auto begin = list->blocks.begin() + list->offsets[static_cast<std::size_t>(r)];
        const auto end = list->blocks.begin() + list->offsets[static_cast<std::size_t>(r + 1)];
        const auto it = std::lower_bound(begin, end, from);
        if (it != end && (best < 0 || *it < best)) best = *it;
      }
    }
    return best;
  }

  void check_list(const BlockList& list, const std::string& kind) const {
    using detail::require;
    const Layout& l = data_->layout;
    const std::string name = "BlockMask." + kind;
    require(list.offsets.size() == static_cast<std::size_t>(l.rows() + 1),
            detail::cat(name, ".offsets.size()"),
            detail::cat("batch * heads * q_blocks + 1 = ", l.rows() + 1), list.offsets.size());
    require(list.offsets.front() == 0, detail::cat(name, ".offsets[0]"), 0, list.offsets.front());
    require(list.offsets.back() == static_cast<Index>(list.blocks.size()),
            detail::cat(name, ".offsets[rows]"),
            detail::cat("blocks.size() = ", list.blocks.size()), list.offsets.back());
    // Offsets first, all of them: the block checks below index blocks[] through them.
    for (std::size_t r = 0; r + 1 < list.offsets.size(); ++r)
      require(list.offsets[r] <= list.offsets[r + 1] &&
                  list.offsets[r + 1] <= static_cast<Index>(list.blocks.size()),
              detail::cat(name, ".offsets[", r + 1, "]"),
              detail::cat(">= offsets[", r, "] = ", list.offsets[r], " and <= blocks.size()"),
              list.offsets[r + 1]);
    for (std::size_t r = 0; r + 1 < list.offsets.size(); ++r) {
      const Index begin = list.offsets[r], end = list.offsets[r + 1];
      for (Index t = begin; t < end; ++t) {
        const Index kb = list.blocks[static_cast<std::size_t>(t)];
        const auto at = detail::cat(name, ".blocks[", t, "]");
        require(kb >= 0 && kb < l.kv_blocks(), at,
                detail::cat("a key block in [0, ", l.kv_blocks(), ")"), kb);
        require(t == begin || list.blocks[static_cast<std::size_t>(t - 1)] < kb, at,
                "greater than the previous block of its row (sorted, no repeats)", kb);
      }
    }
  }

  void check_disjoint() const {
    const Layout& l = data_->layout;
    for (Index r = 0; r < l.rows(); ++r)
      for (Index t = data_->full.offsets[static_cast<std::size_t>(r)];
           t < data_->full.offsets[static_cast<std::size_t>(r + 1)]; ++t) {
        const Index kb = data_->full.blocks[static_cast<std::size_t>(t)];
        detail::require(!listed(data_->partial, r, kb),
                        detail::cat("BlockMask.full.blocks[", t, "]"),
                        detail::cat("a block not also listed partial in row ", r), kb);
      }
  }

  std::shared_ptr<const Data> data_;  // shared: copying a spec copies no block lists
  Rule rule_;
};

/// The BlockMask of any element mask, laid out as `layout`: blocks whose pairs the mask
/// keeps entirely become full, blocks it keeps in part become partial with the mask as
/// their element rule. With heads = 1 the mask is evaluated at head 0 (it must not depend
/// on the head). Uses classify() where the mask has it, and scans pairs where it does not.
template <class Mask>
BlockMask<Mask> make_block_mask(const Mask& mask, const BlockMaskLayout& layout) {
  detail::check_block_layout(layout);
  BlockList partial{{0}, {}}, full{{0}, {}};
  for (Index b = 0; b < layout.batch; ++b)
    for (Index h = 0; h < layout.heads; ++h)
      for (Index qb = 0; qb < layout.q_blocks(); ++qb) {
        const Index r0 = qb * layout.block_q, r1 = std::min(r0 + layout.block_q, layout.q_len);
        const Range q{r0 + layout.q_offset, r1 + layout.q_offset};
        for (Index kb = 0; kb < layout.kv_blocks(); ++kb) {
          const Range kv{kb * layout.block_k, std::min((kb + 1) * layout.block_k, layout.kv_len)};
          TileKind kind = TileKind::Partial;
          if constexpr (detail::has_classify<Mask, Range>::value) kind = mask.classify(b, h, q, kv);
          if (kind == TileKind::Partial) {  // count the pairs: the block may be uniform
            Index kept = 0;
            for (Index i = q.begin; i < q.end; ++i)
              for (Index j = kv.begin; j < kv.end; ++j) kept += mask.keep(b, h, i, j) ? 1 : 0;
            const Index pairs = (q.end - q.begin) * (kv.end - kv.begin);
            kind = kept == 0 ? TileKind::Empty : kept == pairs ? TileKind::Full : TileKind::Partial;
          }
          if (kind == TileKind::Full) full.blocks.push_back(kb);
          if (kind == TileKind::Partial) partial.blocks.push_back(kb);
        }
        full.offsets.push_back(static_cast<Index>(full.blocks.size()));
        partial.offsets.push_back(static_cast<Index>(partial.blocks.size()));
      }
  return BlockMask<Mask>(layout, std::move(partial), std::move(full), mask);
}

/// make_block_mask over q_len queries at the end of kv_len keys (q_offset = kv_len - q_len),
/// one batch, shared across heads.
template <class Mask>
BlockMask<Mask> make_block_mask(const Mask& mask, Index q_len, Index kv_len, Index block_q = 128,
                                Index block_k = 128) {
  BlockMaskLayout layout;
  layout.q_len = q_len;
  layout.kv_len = kv_len;
  layout.block_q = block_q;
  layout.block_k = block_k;
  layout.q_offset = kv_len - q_len;
  return make_block_mask(mask, layout);
}

}  // namespace attnkit
