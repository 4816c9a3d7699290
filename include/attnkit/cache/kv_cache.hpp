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

#include "attnkit/cache/kv_storage.hpp"
#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/position/faces.hpp"
#include "attnkit/position/no_position.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {

template <class T>
class KvCache {
  static_assert(detail::is_kv_storage<T>() && !std::is_const_v<T>,
                "KvCache: storage must be float, Eigen::bfloat16, Eigen::half, BlockQ8_0 or "
                "BlockQ4_0");

 public:
  /// Storage for K [batch, kv_heads, capacity, head_dim] and V [..., value_dim (0: head_dim)],
  /// empty. Throws Error on a negative size, a zero head, head_dim or value_dim, or a size
  /// whose element count overflows.
  KvCache(Index batch, Index kv_heads, Index capacity, Index head_dim, Index value_dim = 0)
      : batch_(batch),
        capacity_(capacity),
        storage_({"KvCache", "batch", "capacity", 0}, batch, kv_heads, capacity, head_dim,
                 value_dim) {}

  Index batch() const { return batch_; }
  Index kv_heads() const { return storage_.kv_heads(); }
  Index head_dim() const { return storage_.head_dim(); }
  Index value_dim() const { return storage_.value_dim(); }
  Index capacity() const { return capacity_; }
  /// Positions filled, the same for every sequence of the batch.
  Index length() const { return length_; }

  /// The filled keys [batch, kv_heads, length, head_dim] and values [..., value_dim].
  View<const T> keys() const { return storage_.keys(0, batch_, length_); }
  View<const T> values() const { return storage_.values(0, batch_, length_); }

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
    static_assert((detail::is_storage<K>() || std::is_same_v<std::remove_const_t<K>, T>)&&(
                      detail::is_storage<V>() || std::is_same_v<std::remove_const_t<V>, T>),
                  "KvCache::append(): rows of float, Eigen::bfloat16, Eigen::half or the "
                  "cache's own storage type");
    const Index n = check_new(k_new, v_new, !kTurns);
    const Index d = head_dim();
    // The keys as stored [batch, kv_heads, n, head_dim], when the Position turns them: turned
    // (and, for quantized storage, checked: a turn moves a pair by up to sqrt 2 of its
    // largest value) before anything is written.
    std::vector<float> turned;
    if constexpr (kTurns) {
      if constexpr (detail::has_validate<Position>::value)
        position.validate(0, length_ + n, 0, batch_, kv_heads());
      detail::validate_head_dim_of(position, head_dim());
      turned.resize(static_cast<std::size_t>(batch_ * kv_heads() * n * d));
      for (Index b = 0; b < batch_; ++b)
        for (Index h = 0; h < kv_heads(); ++h)
          for (Index s = 0; s < n; ++s) {
            float* row = turned.data() + ((b * kv_heads() + h) * n + s) * d;
            detail::row_to_f32(k_new.row(b, h, s), d, row);
            const Index at = length_ + s;
            position.apply(row, d, RowAt{b, h, at, length_ + n, at, Role::Key});
          }
      detail::KvStorage<T>::require_encodable_rows(
          bhsd(static_cast<const float*>(turned.data()), batch_, kv_heads(), n, d),
          "k_new (turned by the Position)");
    }
    for (Index b = 0; b < batch_; ++b)
      for (Index h = 0; h < kv_heads(); ++h)
        for (Index s = 0; s < n; ++s) {
          const Index at = length_ + s;
          storage_.put_value(b, h, at, v_new.row(b, h, s));
          if constexpr (kTurns) {
            storage_.put_key(b, h, at, turned.data() + ((b * kv_heads() + h) * n + s) * d);
          } else {
            storage_.put_key(b, h, at, k_new.row(b, h, s));
          }
        }
    length_ += n;
  }

 private:
  // Every check of append(); returns n, the number of new positions.
  template <class K, class V>
  Index check_new(const View<K>& k, const View<V>& v, bool keys_as_given) const {
    storage_.check_new(k, v, "the cache's storage", keys_as_given);
    detail::require_dim(k.batch, batch_, "k_new.batch", "KvCache.batch");
    detail::require_dim(v.batch, batch_, "v_new.batch", "KvCache.batch");
    detail::require(
        k.seq <= capacity_ - length_, "KvCache::append: new positions",
        detail::cat("<= capacity - length = ", capacity_ - length_, " (capacity ", capacity_, ")"),
        k.seq);
    return k.seq;
  }

  Index batch_, capacity_;
  Index length_ = 0;
  detail::KvStorage<T> storage_;  // [batch, kv_heads, capacity, head_dim | value_dim]
};

}  // namespace attnkit
