// KvStorage<T>: the K and V arrays that KvCache and PagedKv own -- K [outer, kv_heads,
// positions, head_dim] and V [..., value_dim], zero-filled, on cache lines and huge pages
// (detail::AlignedVector) -- with their size checks, views, the checks of rows to append
// and the row writes. The outer index is a KvCache's batch and a PagedKv's page; positions
// are a KvCache's capacity and a page's size. The owners keep their lengths and tables.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/error.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/aligned.hpp"
#include "attnkit/detail/view_checks.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

template <class T>
class KvStorage {
 public:
  /// How the owner names its sizes in error messages, and the fewest positions it allows.
  struct Names {
    const char* owner;      // "KvCache"
    const char* outer;      // "batch"
    const char* positions;  // "capacity"
    Index min_positions;
  };

  /// Throws Error on a negative outer count, positions under names.min_positions, a zero
  /// head or head_dim, a negative value_dim (0: head_dim), or an element count that
  /// overflows.
  KvStorage(const Names& names, Index outer, Index kv_heads, Index positions, Index head_dim,
            Index value_dim)
      : owner_(names.owner),
        heads_(kv_heads),
        positions_(positions),
        dim_(head_dim),
        value_dim_(value_dim > 0 ? value_dim : head_dim) {
    const std::string at = owner_ + ".";
    require(outer >= 0, at + names.outer, ">= 0", outer);
    require(kv_heads >= 1, at + "kv_heads", ">= 1", kv_heads);
    require(positions >= names.min_positions, at + names.positions,
            detail::cat(">= ", names.min_positions), positions);
    require(head_dim >= 1, at + "head_dim", ">= 1", head_dim);
    require(value_dim >= 0, at + "value_dim", ">= 0 (0: head_dim)", value_dim);
    if constexpr (is_block_quantized<T>()) {
      require_whole_blocks((at + "head_dim").c_str(), dim_);
      require_whole_blocks((at + "value_dim").c_str(), value_dim_);
    }
    Index k_elems = 0, v_elems = 0;
    require(
        checked_product({outer, kv_heads, positions, row_elements<T>(dim_)}, &k_elems) &&
            checked_product({outer, kv_heads, positions, row_elements<T>(value_dim_)}, &v_elems),
        owner_,
        std::string(names.outer) + " * kv_heads * " + names.positions + " * dim that fits in Index",
        "an overflow");
    keys_.assign(static_cast<std::size_t>(k_elems), zero());
    values_.assign(static_cast<std::size_t>(v_elems), zero());
  }

  Index kv_heads() const { return heads_; }
  Index head_dim() const { return dim_; }
  Index value_dim() const { return value_dim_; }

  /// Rows [0, rows) of outer indices [o, o + count): K [count, kv_heads, rows, head_dim] and
  /// V [..., value_dim], strided views of the storage.
  View<const T> keys(Index o, Index count, Index rows) const {
    return view(keys_.data(), dim_, o, count, rows);
  }
  View<const T> values(Index o, Index count, Index rows) const {
    return view(values_.data(), value_dim_, o, count, rows);
  }
  View<T> keys(Index o, Index count, Index rows) {
    return view(keys_.data(), dim_, o, count, rows);
  }
  View<T> values(Index o, Index count, Index rows) {
    return view(values_.data(), value_dim_, o, count, rows);
  }

  /// The checks of rows to append that do not depend on the owner's batch or length: valid
  /// views, kv_heads, head_dim, value_dim and n alike, and no memory shared with the storage
  /// (named `storage` in the message). Quantized storage: values it can encode, the keys
  /// only when they are stored as given (`keys_as_given`; turned keys are checked as turned,
  /// require_encodable_rows()).
  template <class K, class V>
  void check_new(const View<K>& k, const View<V>& v, const char* storage,
                 bool keys_as_given = true) const {
    check_view(k, "k_new");
    check_view(v, "v_new");
    require_dim(k.heads, heads_, "k_new.heads", cat(owner_, ".kv_heads"));
    require_dim(v.heads, heads_, "v_new.heads", cat(owner_, ".kv_heads"));
    require_dim(k.dim, dim_, "k_new.dim", cat(owner_, ".head_dim"));
    require_dim(v.dim, value_dim_, "v_new.dim", cat(owner_, ".value_dim"));
    require_dim(v.seq, k.seq, "v_new.seq", "k_new.seq");
    for (const ByteSpan& s : {span_of(keys_), span_of(values_)}) {
      require_disjoint(byte_span(k), "k_new", s, storage);
      require_disjoint(byte_span(v), "v_new", s, storage);
    }
    if constexpr (is_block_quantized<T>()) {  // quantizing needs values it can encode
      if (keys_as_given) require_encodable_rows(k, "k_new");
      require_encodable_rows(v, "v_new");
    }
  }

  /// Key row (o, h, r) = the head_dim values at src, any storage type (rounded to T); the
  /// same for a value row.
  template <class S>
  void put_key(Index o, Index h, Index r, const S* src) {
    copy_row(src, dim_, keys_.data() + slot(o, h, r) * row_elements<T>(dim_));
  }
  template <class S>
  void put_value(Index o, Index h, Index r, const S* src) {
    copy_row(src, value_dim_, values_.data() + slot(o, h, r) * row_elements<T>(value_dim_));
  }

 private:
  Index slot(Index o, Index h, Index r) const { return (o * heads_ + h) * positions_ + r; }

  template <class U>
  View<U> view(U* base, Index dim, Index o, Index count, Index rows) const {
    const Index e = row_elements<T>(dim);  // elements (blocks) of a row
    return strided(base + slot(o, 0, 0) * e, {count, heads_, rows, dim},
                   {heads_ * positions_ * e, positions_ * e, e});
  }

  static T zero() {
    if constexpr (is_block_quantized<T>())
      return T{};  // scale 0: every value 0
    else
      return T(0.f);
  }

  // dst = the row src of dim values, rounded or quantized to T (rows of T's own blocks copy).
  template <class S>
  void copy_row(const S* src, Index dim, T* dst) {
    using U = std::remove_const_t<S>;
    if constexpr (std::is_same_v<U, T>) {
      std::copy(src, src + row_elements<T>(dim), dst);
    } else if constexpr (is_block_quantized<T>() && std::is_same_v<U, float>) {
      row_from_f32(src, dim, dst);
    } else if constexpr (is_block_quantized<T>()) {  // widened to f32 on the way
      static_assert(!is_block_quantized<S>(), "KvStorage: one quantized type into another");
      staging_.resize(static_cast<std::size_t>(dim));
      row_to_f32(src, dim, staging_.data());
      row_from_f32(staging_.data(), dim, dst);
    } else {
      for (Index c = 0; c < dim; ++c) dst[c] = static_cast<T>(value_at(src, c));
    }
  }

  // Throws Error naming the first row of x holding a value T cannot encode (not finite, or
  // too large for the block's half scale: storage/quantize.hpp). Nothing for other storage.
 public:
  template <class S>
  static void require_encodable_rows(const View<S>& x, const char* name) {
    if constexpr (is_block_quantized<T>()) {  // (other storage has no bound to ask about)
      std::vector<float> row(static_cast<std::size_t>(x.dim));
      for (Index b = 0; b < x.batch; ++b)
        for (Index h = 0; h < x.heads; ++h)
          for (Index s = 0; s < x.seq; ++s) {
            row_to_f32(x.row(b, h, s), x.dim, row.data());
            const Index c = first_unencodable<T>(row.data(), x.dim);
            if (c >= 0)
              fail(cat(name, " row (", b, ", ", h, ", ", s, ")"),
                   cat("finite values of magnitude below ", max_encodable<T>(),
                       " (quantized storage)"),
                   cat(row[static_cast<std::size_t>(c)], " at ", c));
          }
    } else {
      (void)x;
      (void)name;
    }
  }

 private:
  static ByteSpan span_of(const AlignedVector<T>& data) {
    const auto begin = reinterpret_cast<std::uintptr_t>(data.data());
    return {begin, begin + data.size() * sizeof(T)};
  }

  std::string owner_;
  Index heads_, positions_, dim_, value_dim_;
  AlignedVector<T> keys_;       // [outer, kv_heads, positions, head_dim]
  AlignedVector<T> values_;     // [outer, kv_heads, positions, value_dim]
  std::vector<float> staging_;  // one row in f32, on its way to quantized storage
};

}  // namespace attnkit::detail
