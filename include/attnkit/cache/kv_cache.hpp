// KvCache<T>: the keys and values of a batch of growing sequences, owned in storage type T
// (float, Eigen::bfloat16, Eigen::half), BHSD with room for `capacity` positions. One length
// is shared by the whole batch (every sequence advances together, as in batched greedy
// decoding); sequences of different lengths go through attention_varlen() or paged KV.
// keys() / values() are views of the filled part, for attention() and decode().
//
// RoPE models, two correct ways (never both: keys would turn twice):
//  1. Keys stored rotated: append(k, v, rope) turns row s of the new keys at position
//     length() + s; queries turn at their positions (apply_position(rope, q, Role::Query,
//     length() - n) after appending n tokens), and attention() runs without a Position.
//     Each key is turned once, when it enters the cache: the way models are served.
//  2. Keys stored as they come (append(k, v)); attention() with Rope in the spec turns every
//     cached key at j and queries at the default q_offset = Lk - Lq, on every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/aligned.hpp"
#include "attnkit/detail/checked.hpp"
#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/error.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/position/row_at.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit {

template <class T>
class KvCache {
  static_assert(detail::is_storage<T>() && !std::is_const_v<T>,
                "KvCache: storage must be float, Eigen::bfloat16 or Eigen::half");

 public:
  /// Storage for K [batch, kv_heads, capacity, head_dim] and V [..., value_dim (0: head_dim)],
  /// empty. Throws Error on a negative size, a zero head, head_dim or value_dim, or a size
  /// whose element count overflows.
  KvCache(Index batch, Index kv_heads, Index capacity, Index head_dim, Index value_dim = 0)
      : batch_(batch),
        heads_(kv_heads),
        capacity_(capacity),
        dim_(head_dim),
        value_dim_(value_dim > 0 ? value_dim : head_dim) {
    using detail::require;
    require(batch >= 0, "KvCache.batch", ">= 0", batch);
    require(kv_heads >= 1, "KvCache.kv_heads", ">= 1", kv_heads);
    require(capacity >= 0, "KvCache.capacity", ">= 0", capacity);
    require(head_dim >= 1, "KvCache.head_dim", ">= 1", head_dim);
    require(value_dim >= 0, "KvCache.value_dim", ">= 0 (0: head_dim)", value_dim);
    Index k_elems = 0, v_elems = 0;
    require(detail::checked_product({batch, kv_heads, capacity, dim_}, &k_elems) &&
                detail::checked_product({batch, kv_heads, capacity, value_dim_}, &v_elems),
            "KvCache", "batch * kv_heads * capacity * dim that fits in Index", "an overflow");
    keys_.assign(static_cast<std::size_t>(k_elems), T(0.f));
    values_.assign(static_cast<std::size_t>(v_elems), T(0.f));
  }

  Index batch() const { return batch_; }
  Index kv_heads() const { return heads_; }
  Index head_dim() const { return dim_; }
  Index value_dim() const { return value_dim_; }
  Index capacity() const { return capacity_; }
  /// Positions filled, the same for every sequence of the batch.
  Index length() const { return length_; }

  /// The filled keys [batch, kv_heads, length, head_dim] and values [..., value_dim].
  View<const T> keys() const { return filled(keys_.data(), dim_); }
  View<const T> values() const { return filled(values_.data(), value_dim_); }

  /// Forgets every position (storage kept).
  void clear() { length_ = 0; }

  /// Appends k_new [batch, kv_heads, n, head_dim] and v_new [..., n, value_dim], any storage
  /// type (converted to T), at positions [length, length + n). Throws Error, with the cache
  /// unchanged, on a shape mismatch, on overflow of the capacity, or when a new view shares
  /// memory with the cache.
  template <class K, class V>
  void append(const View<K>& k_new, const View<V>& v_new) {
    append(k_new, v_new, NoPosition{});
  }

  /// The same, with key row s turned by a row-transforming Position (Rope, Fope) at its
  /// position length + s, stored rotated. Position ids, if the policy has them, index the
  /// keys as one view of length + n rows (the whole cache after the append). The policy's
  /// own checks (position within the table) run before anything is written.
  template <class K, class V, class Position>
  void append(const View<K>& k_new, const View<V>& v_new, const Position& position) {
    constexpr bool kTurns = detail::transforms_rows<Position>();
    static_assert(kTurns || std::is_same_v<Position, NoPosition>,
                  "KvCache::append(): a Position needs apply(float* row, Index dim, RowAt) "
                  "(a row transform such as Rope)");
    static_assert(detail::is_storage<K>() && detail::is_storage<V>(),
                  "KvCache::append(): storage must be float, Eigen::bfloat16 or Eigen::half");
    const Index n = check_new(k_new, v_new);
    if constexpr (kTurns) {
      if constexpr (detail::has_validate<Position>::value)
        position.validate(0, length_ + n, 0, batch_, heads_);
      detail::validate_head_dim_of(position, dim_);
    }
    std::vector<float> row(static_cast<std::size_t>(dim_));  // [head_dim]
    for (Index b = 0; b < batch_; ++b)
      for (Index h = 0; h < heads_; ++h)
        for (Index s = 0; s < n; ++s) {
          const Index at = length_ + s;
          copy_row(v_new.row(b, h, s), value_dim_, slot(values_.data(), value_dim_, b, h, at));
          if constexpr (kTurns) {
            copy_row(k_new.row(b, h, s), dim_, row.data());
            position.apply(row.data(), dim_, RowAt{b, h, at, length_ + n, at, Role::Key});
            copy_row(row.data(), dim_, slot(keys_.data(), dim_, b, h, at));
          } else {
            copy_row(k_new.row(b, h, s), dim_, slot(keys_.data(), dim_, b, h, at));
          }
        }
    length_ += n;
  }

 private:
  template <class S, class D>
  static void copy_row(const S* src, Index dim, D* dst) {
    for (Index c = 0; c < dim; ++c) dst[c] = static_cast<D>(static_cast<float>(src[c]));
  }

  template <class U>
  U* slot(U* base, Index dim, Index b, Index h, Index s) const {
    return base + ((b * heads_ + h) * capacity_ + s) * dim;
  }

  View<const T> filled(const T* base, Index dim) const {
    return strided(base, {batch_, heads_, length_, dim},
                   {heads_ * capacity_ * dim, capacity_ * dim, dim});
  }

  // Every check of append(); returns n, the number of new positions.
  template <class K, class V>
  Index check_new(const View<K>& k, const View<V>& v) const {
    using detail::require;
    using detail::require_dim;
    detail::check_view(k, "k_new");
    detail::check_view(v, "v_new");
    require_dim(k.batch, batch_, "k_new.batch", "KvCache.batch");
    require_dim(k.heads, heads_, "k_new.heads", "KvCache.kv_heads");
    require_dim(k.dim, dim_, "k_new.dim", "KvCache.head_dim");
    require_dim(v.batch, batch_, "v_new.batch", "KvCache.batch");
    require_dim(v.heads, heads_, "v_new.heads", "KvCache.kv_heads");
    require_dim(v.seq, k.seq, "v_new.seq", "k_new.seq");
    require_dim(v.dim, value_dim_, "v_new.dim", "KvCache.value_dim");
    require(k.seq <= capacity_ - length_, "KvCache::append: new positions",
            "<= capacity - length = " + std::to_string(capacity_ - length_) + " (capacity " +
                std::to_string(capacity_) + ")",
            k.seq);
    const detail::ByteSpan mine[2] = {span_of(keys_), span_of(values_)};
    for (const detail::ByteSpan& s : mine) {
      detail::require_disjoint(detail::byte_span(k), "k_new", s, "the cache's storage");
      detail::require_disjoint(detail::byte_span(v), "v_new", s, "the cache's storage");
    }
    return k.seq;
  }

  static detail::ByteSpan span_of(const detail::AlignedVector<T>& data) {
    const auto begin = reinterpret_cast<std::uintptr_t>(data.data());
    return {begin, begin + data.size() * sizeof(T)};
  }

  Index batch_, heads_, capacity_, dim_, value_dim_;
  Index length_ = 0;
  detail::AlignedVector<T> keys_;    // [batch, kv_heads, capacity, head_dim]
  detail::AlignedVector<T> values_;  // [batch, kv_heads, capacity, value_dim]
};

}  // namespace attnkit
