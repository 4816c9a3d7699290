// PairKv: the K and V of one attention() call in the layouts of the bf16 pair products
// (kernel/tiles/tile_pair_products.hpp, gemm/tile_gemm_bf16.hpp), packed and rounded to bf16 once
// per call, so that every query tile multiplies them in place instead of packing each key
// tile again: key rows [B, Hkv, Lk, D'] (D' = D rounded up to even), value rows in pairs of
// keys [B, Hkv, ceil(Lk / 2), dv_pad] (pair p holds keys 2p and 2p + 1: a key tile that starts
// at an even key and spans an even count reads whole pairs), and whether each value row is
// finite (a masked key's non-finite value must not meet a zero weight, value_guard.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "attnkit/core/checked.hpp"
#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/parallel.hpp"
#include "attnkit/gemm/tile_gemm_bf16.hpp"
#include "attnkit/storage/bf16_round.hpp"
#include "attnkit/storage/storage_rows.hpp"

namespace attnkit::detail {

struct PairKv {
  std::vector<std::uint16_t> keys;    // [B, Hkv, Lk, D']
  std::vector<std::uint32_t> values;  // [B, Hkv, ceil(Lk / 2), dv_pad]
  std::vector<char> finite;           // [B, Hkv, Lk] the value row holds no inf or NaN
  Index kv_heads = 0, len = 0, d_even = 0, dv_pad = 0;

  bool empty() const { return keys.empty(); }
  Index head(Index b, Index hk) const { return b * kv_heads + hk; }
  const std::uint16_t* key_rows(Index b, Index hk, Index j) const {
    return keys.data() + (head(b, hk) * len + j) * d_even;
  }
  /// Pairs from key j on (j even).
  const std::uint32_t* value_pairs(Index b, Index hk, Index j) const {
    return values.data() + (head(b, hk) * pairs() + j / 2) * dv_pad;
  }
  /// Whether the value rows [j0, j1) are all finite.
  bool finite_rows(Index b, Index hk, Index j0, Index j1) const {
    const char* f = finite.data() + head(b, hk) * len;
    for (Index j = j0; j < j1; ++j)
      if (f[j] == 0) return false;
    return true;
  }
  Index pairs() const { return (len + 1) / 2; }
};

/// Reads row (b, h, j) of a view of some storage as f32 (its dim values) into out.
using RowReader = void (*)(const void* view, Index b, Index h, Index j, float* out);
template <class T>
void read_row(const void* view, Index b, Index h, Index j, float* out) {
  const View<T>& v = *static_cast<const View<T>*>(view);
  row_to_f32(v.row(b, h, j), v.dim, out);
}

/// pack_pair_kv() on rows read through `key` and `value` (one instance for every storage
/// type: the packing and its parallel loop are compiled once per translation unit).
inline PairKv pack_pair_rows(Index batch, Index kv_heads, Index len, Index d, Index dv,
                             Index dv_pad, RowReader key, const void* k, RowReader value,
                             const void* v, int threads) {
  PairKv out;
  out.kv_heads = kv_heads;
  out.len = len;
  out.d_even = d + d % 2;
  out.dv_pad = dv_pad;
  const Index heads = batch * kv_heads;
  std::ptrdiff_t nk = 0, nv = 0, nf = 0;
  if (!checked_product({heads, len, out.d_even}, &nk) ||
      !checked_product({heads, out.pairs(), dv_pad}, &nv) || !checked_product({heads, len}, &nf))
    throw std::bad_alloc();
  out.keys.resize(static_cast<std::size_t>(nk));
  out.values.resize(static_cast<std::size_t>(nv));
  out.finite.resize(static_cast<std::size_t>(nf));
  parallel_for(threads, heads, 1, [&](Index bh) {
    const Index b = bh / kv_heads, hk = bh % kv_heads;
    std::vector<float> row(static_cast<std::size_t>(2 * dv_pad + d), 0.f);
    float* kr = row.data() + 2 * dv_pad;  // one key row; two value rows before it
    for (Index j = 0; j < len; ++j) {
      key(k, b, hk, j, kr);
      gemm::pack_bf16_rows(kr, d, 1, 1, d, out.keys.data() + (bh * len + j) * out.d_even,
                           out.d_even);
    }
    for (Index j = 0; j < len; j += 2) {
      const Index rows = j + 1 < len ? 2 : 1;
      for (Index r = 0; r < rows; ++r) {
        float* vr = row.data() + r * dv_pad;
        value(v, b, hk, j + r, vr);
        bool ok = true;  // as rounded: a finite f32 past bf16's largest becomes inf
        for (Index c = 0; c < dv; ++c) {
          const float x = round_to_bf16(vr[c]);
          ok = ok && x - x == 0.f;
        }
        out.finite[static_cast<std::size_t>(bh * len + j + r)] = ok ? 1 : 0;
      }
      gemm::pack_bf16_pairs(row.data(), dv_pad, rows, dv_pad,
                            out.values.data() + (bh * out.pairs() + j / 2) * dv_pad, dv_pad);
    }
  });
  return out;
}

/// k and v packed for the pair products (values dv_pad apart), over `threads` threads. Throws
/// std::bad_alloc when the copies' sizes overflow or cannot be allocated.
template <class K, class V>
PairKv pack_pair_kv(const View<K>& k, const View<V>& v, Index dv_pad, int threads) {
  return pack_pair_rows(k.batch, k.heads, k.seq, k.dim, v.dim, dv_pad, &read_row<K>, &k,
                        &read_row<V>, &v, threads);
}

}  // namespace attnkit::detail
