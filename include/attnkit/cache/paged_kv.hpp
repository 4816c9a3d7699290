// PagedKv<T>: paged KV storage (the layout of vLLM / FlashInfer). One pool holds K pages
// [num_pages, Hkv, page_size, D] and V pages [num_pages, Hkv, page_size, Dv] in storage T;
// each sequence owns a block table (the pool pages holding its positions 0 .. length - 1,
// page_size positions per page, in order) and a length. append(seq, k, v) takes new pages
// from a free list; assign(seq, pages, length) installs a block table chosen elsewhere (the
// page contents are then written through key_page() / value_page()); release(seq) returns a
// sequence's pages. attention_paged() (cache/attention_paged.hpp) comes with this header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "attnkit/cache/attention_paged.hpp"
#include "attnkit/cache/kv_storage.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/problem.hpp"

namespace attnkit {

template <class T>
class PagedKv {
  static_assert(detail::is_kv_storage<T>() && !std::is_const_v<T>,
                "PagedKv: storage must be float, Eigen::bfloat16, Eigen::half, BlockQ8_0 or "
                "BlockQ4_0");

 public:
  /// A pool of num_pages pages of page_size positions, every page free, no sequence.
  /// Throws Error on a negative page count, a zero head, page size, head_dim or value_dim,
  /// or a size whose element count overflows.
  PagedKv(Index num_pages, Index kv_heads, Index page_size, Index head_dim, Index value_dim = 0)
      : pages_(num_pages),
        page_size_(page_size),
        storage_({"PagedKv", "num_pages", "page_size", 1}, num_pages, kv_heads, page_size, head_dim,
                 value_dim) {
    owner_.assign(static_cast<std::size_t>(num_pages), -1);
    for (Index p = num_pages - 1; p >= 0; --p) free_.push_back(p);  // lowest page first
  }

  Index num_pages() const { return pages_; }
  Index kv_heads() const { return storage_.kv_heads(); }
  Index page_size() const { return page_size_; }
  Index head_dim() const { return storage_.head_dim(); }
  Index value_dim() const { return storage_.value_dim(); }
  Index free_pages() const { return static_cast<Index>(free_.size()); }
  Index sequences() const { return static_cast<Index>(tables_.size()); }

  /// A new empty sequence; returns its index.
  Index add_sequence() {
    tables_.emplace_back();
    lengths_.push_back(0);
    return sequences() - 1;
  }

  Index length(Index seq) const { return lengths_[static_cast<std::size_t>(check_seq(seq))]; }
  const std::vector<Index>& block_table(Index seq) const {
    return tables_[static_cast<std::size_t>(check_seq(seq))];
  }

  /// Page `page` of the pool, all page_size positions: K [1, kv_heads, page_size, head_dim],
  /// V [..., value_dim] (writable: fill pages installed by assign()). Error if out of range.
  View<T> key_page(Index page) { return storage_.keys(check_page(page), 1, page_size_); }
  View<T> value_page(Index page) { return storage_.values(check_page(page), 1, page_size_); }
  View<const T> key_page(Index page) const {
    return storage_.keys(check_page(page), 1, page_size_);
  }
  View<const T> value_page(Index page) const {
    return storage_.values(check_page(page), 1, page_size_);
  }

  /// The filled rows of the p-th page of sequence seq's block table (no copy).
  View<const T> sequence_keys(Index seq, Index p) const {
    return storage_.keys(table_page(seq, p), 1, rows_in(seq, p));
  }
  View<const T> sequence_values(Index seq, Index p) const {
    return storage_.values(table_page(seq, p), 1, rows_in(seq, p));
  }

  /// Appends k_new [1, kv_heads, n, head_dim], v_new [1, kv_heads, n, value_dim] (any storage
  /// type, converted to T) at positions [length, length + n) of sequence seq, taking pages
  /// from the free list as needed. Throws Error, with the pool unchanged, on a bad sequence
  /// index, a shape mismatch, new views sharing memory with the pool, or too few free pages.
  template <class K, class V>
  void append(Index seq, const View<K>& k_new, const View<V>& v_new) {
    static_assert((detail::is_storage<K>() || std::is_same_v<std::remove_const_t<K>, T>)&&(
                      detail::is_storage<V>() || std::is_same_v<std::remove_const_t<V>, T>),
                  "PagedKv::append(): rows of float, Eigen::bfloat16, Eigen::half or the "
                  "cache's own storage type");
    using detail::require;
    using detail::require_dim;
    check_seq(seq);
    storage_.check_new(k_new, v_new, "the pool's storage");
    require_dim(k_new.batch, 1, "k_new.batch", "1 (one sequence)");
    require_dim(v_new.batch, 1, "v_new.batch", "1 (one sequence)");
    std::vector<Index>& table = tables_[static_cast<std::size_t>(seq)];
    Index& len = lengths_[static_cast<std::size_t>(seq)];
    const Index n = k_new.seq;
    require(n <= kMaxLength - len, "PagedKv::append: new positions", "a length that fits", n);
    const Index needed = pages_for(len + n) - static_cast<Index>(table.size());
    require(needed <= free_pages(), "PagedKv::append: pages",
            detail::cat("<= ", free_pages(), " free pages (pool exhausted)"), needed);
    for (Index i = 0; i < needed; ++i) {
      table.push_back(free_.back());
      owner_[static_cast<std::size_t>(free_.back())] = seq;
      free_.pop_back();
    }
    for (Index s = 0; s < n; ++s) {
      const Index at = len + s;
      const Index page = table[static_cast<std::size_t>(at / page_size_)], r = at % page_size_;
      for (Index h = 0; h < kv_heads(); ++h) {
        storage_.put_key(page, h, r, k_new.row(0, h, s));
        storage_.put_value(page, h, r, v_new.row(0, h, s));
      }
    }
    len += n;
  }

  /// Installs a block table for seq: `pages` (in order) hold its positions 0 .. length - 1;
  /// exactly ceil(length / page_size) pages. The sequence's old pages return to the free
  /// list. Throws Error, with nothing changed, on a page index out of range, a page listed
  /// twice or owned by another sequence, or a page count that does not fit the length.
  void assign(Index seq, const std::vector<Index>& pages, Index length) {
    using detail::require;
    check_seq(seq);
    require(length >= 0 && length <= kMaxLength, "PagedKv::assign: length",
            detail::cat("in [0, ", kMaxLength, "]"), length);
    require(static_cast<Index>(pages.size()) == pages_for(length), "PagedKv::assign: pages.size()",
            detail::cat("ceil(length / page_size) = ", pages_for(length)), pages.size());
    std::vector<char> seen(static_cast<std::size_t>(pages_), 0);
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const auto name = detail::cat("PagedKv::assign: pages[", i, "]");
      const Index p = pages[i];
      require(p >= 0 && p < pages_, name, detail::cat("a page index in [0, ", pages_, ")"), p);
      require(!seen[static_cast<std::size_t>(p)], name, "listed once", "a repeated page");
      const Index owner = owner_[static_cast<std::size_t>(p)];
      require(owner < 0 || owner == seq, name, "a free page or one of this sequence",
              detail::cat("a page of sequence ", owner));
      seen[static_cast<std::size_t>(p)] = 1;
    }
    release(seq);
    for (const Index p : pages) {
      free_.erase(std::find(free_.begin(), free_.end(), p));
      owner_[static_cast<std::size_t>(p)] = seq;
    }
    tables_[static_cast<std::size_t>(seq)] = pages;
    lengths_[static_cast<std::size_t>(seq)] = length;
  }

  /// Returns seq's pages to the free list; its length becomes 0 (the sequence stays).
  void release(Index seq) {
    std::vector<Index>& table = tables_[static_cast<std::size_t>(check_seq(seq))];
    for (auto it = table.rbegin(); it != table.rend(); ++it) {
      owner_[static_cast<std::size_t>(*it)] = -1;
      free_.push_back(*it);
    }
    table.clear();
    lengths_[static_cast<std::size_t>(seq)] = 0;
  }

 private:
  static constexpr Index kMaxLength = Index{1} << 40;

  // ceil(length / page_size), without the overflow of length + page_size - 1.
  Index pages_for(Index length) const {
    return length / page_size_ + (length % page_size_ != 0 ? 1 : 0);
  }

  // The index checks of the accessors, which decode calls for every page (cat(): no message
  // is built unless a check fails).
  Index check_seq(Index seq) const {
    detail::require(seq >= 0 && seq < sequences(), "PagedKv: sequence",
                    detail::cat("in [0, ", sequences(), ")"), seq);
    return seq;
  }
  Index check_page(Index page) const {
    detail::require(page >= 0 && page < pages_, "PagedKv: page index",
                    detail::cat("in [0, ", pages_, ")"), page);
    return page;
  }
  Index table_page(Index seq, Index p) const {
    const std::vector<Index>& table = block_table(seq);
    detail::require(p >= 0 && p < static_cast<Index>(table.size()), "PagedKv: block table entry",
                    detail::cat("in [0, ", table.size(), ")"), p);
    return table[static_cast<std::size_t>(p)];
  }
  Index rows_in(Index seq, Index p) const {
    return std::min(page_size_, length(seq) - p * page_size_);
  }

  Index pages_, page_size_;
  detail::KvStorage<T> storage_;  // [num_pages, kv_heads, page_size, head_dim | value_dim]
  std::vector<Index> free_;       // free pages, the next one at the back
  std::vector<Index> owner_;      // [num_pages] owning sequence, -1: free
  std::vector<std::vector<Index>> tables_;  // per sequence: its pages in order
  std::vector<Index> lengths_;              // per sequence
};

}  // namespace attnkit
