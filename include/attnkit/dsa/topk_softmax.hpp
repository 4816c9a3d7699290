// TopkSoftmax: topk_attention()'s engine for plain softmax over Dot scores (sinks allowed), one
// (batch, query, KV head) at a time: the selected keys gathered transposed (f32 [D, n], 16
// rows at a time through registers) and the values as rows, then for the G query heads
// that read the KV head
//   S [G, n] = (scale Q) K_sel^T,  P = exp(S - m) per row (m with the sink), l = row sum,
//   O [G, Dv] = P V_sel / l
// on the tile GEMM: n (D + Dv) G multiply-adds after an O(n (D + Dv)) gather.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/simd/transpose.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

/// out [ld, np] = the rows keys[0, n) of head g (batch b) of x in f32, transposed (zero past
/// n), kWidth rows at a time through registers (tile: [kWidth, ld] scratch); with `rows`, the
/// gathered rows are also kept there [n, ld] (whole blocks packed there directly).
template <class T>
void gather_transposed(const View<T>& x, Index b, Index g, const Index* keys, Index n, Index ld,
                       Index np, float* tile, float* out, float* rows = nullptr) {
  const Index W = simd::kWidth;
  for (Index r0 = 0; r0 < np; r0 += W) {
    float* block = rows != nullptr && r0 + W <= n ? rows + r0 * ld : tile;
    for (Index r = 0; r < W; ++r) {
      float* row = block + r * ld;
      if (r0 + r < n)
        pack_rows(x, b, g, keys[r0 + r], 1, row, ld);
      else
        std::fill(row, row + ld, 0.f);
      if (rows != nullptr && block == tile && r0 + r < n)
        std::copy_n(row, ld, rows + (r0 + r) * ld);
    }
    for (Index c = 0; c < ld; c += W) simd::transpose_block(block + c, ld, out + c * np + r0, np);
  }
}

class TopkSoftmax {
 public:
  /// The G = `heads` query rows of heads h0 .. h0 + G at query t (batch b), over the keys
  /// `keys` (topk entries, -1 skipped) of head g of k and v; writes their rows of o and, if
  /// given, lse[h * lse_stride]. sinks: the heads' sink logits (null: none).
  template <class Q, class K, class V, class O>
  void run(const View<Q>& q, const View<K>& k, const View<V>& v, const View<O>& o, Index b,
           Index h0, Index t, Index heads, Index g, const std::int32_t* keys, Index topk,
           float scale, const float* sinks, float* lse, Index lse_stride) {
    const Index D = q.dim, Dv = v.dim, ldd = simd::round_up(D), ldv = simd::round_up(Dv);
    const Index G = heads, W = simd::kWidth;
    Index n = 0;
    rows_.resize(std::size_t(topk));
    for (Index i = 0; i < topk; ++i)
      if (keys[i] >= 0) rows_[std::size_t(n++)] = keys[i];
    const Index np = simd::round_up(std::max<Index>(n, 1));
    // MLA's latent: V a view of K's first Dv values (the same rows): one gather serves both.
    const bool latent = static_cast<const void*>(v.data) == static_cast<const void*>(k.data) &&
                        v.seq_stride == k.seq_stride && v.head_stride == k.head_stride &&
                        v.batch_stride == k.batch_stride && Dv <= D &&
                        std::is_same_v<std::remove_const_t<K>, std::remove_const_t<V>>;
    size(kt_, ldd * np);
    size(vg_, n * (latent ? ldd : ldv));
    size(qs_, G * ldd);
    size(s_, G * np);
    size(og_, G * ldv);
    size(tile_, W * ldd);
    // kt_ [ldd, np] = the selected keys transposed; over a latent its rows are the values too.
    gather_transposed(k, b, g, rows_.data(), n, ldd, np, tile_.data(), kt_.data(),
                      latent ? vg_.data() : nullptr);
    const Index ldvg = latent ? ldd : ldv;  // the rows of vg_
    if (!latent)
      for (Index r = 0; r < n; ++r)
        pack_rows(v, b, g, rows_[std::size_t(r)], 1, vg_.data() + r * ldv, ldv);
    for (Index h = 0; h < G; ++h) {
      float* row = qs_.data() + h * ldd;
      pack_rows(q, b, h0 + h, t, 1, row, ldd);
      for (Index c = 0; c < ldd; ++c) row[c] *= scale;
    }
    using simd::Vec;
    const float inf = std::numeric_limits<float>::infinity();
    if (n > 0) gemm::gemm(G, np, D, {qs_.data(), ldd, 1}, kt_.data(), np, s_.data(), np, false);
    for (Index h = 0; h < G; ++h) {  // softmax of row h: P in place, m and l
      float* x = s_.data() + h * np;
      std::fill(x + n, x + np, -inf);
      Vec mv(sinks != nullptr ? sinks[h] : -inf);
      for (Index c = 0; c < np; c += W) mv = simd::max(mv, simd::load(x + c));
      const float m = simd::reduce_max(mv);
      const Vec log2e(1.4426950408889634f), mm(m > -inf ? m : 0.f);
      Vec lv(0.f);
      for (Index c = 0; c < np; c += W) {
        const Vec p = simd::exp2((simd::load(x + c) - mm) * log2e);
        simd::store(x + c, p);
        lv = lv + p;
      }
      float l = simd::reduce_add(lv);
      if (sinks != nullptr) l += std::exp(sinks[h] - m);
      norm(h, m, l, lse, lse_stride);
    }
    if (n > 0)
      gemm::gemm(G, ldv, n, {s_.data(), np, 1}, vg_.data(), ldvg, og_.data(), ldv, false);
    else
      std::fill(og_.begin(), og_.begin() + G * ldv, 0.f);
    for (Index h = 0; h < G; ++h) {
      float* row = og_.data() + h * ldv;
      const float inv = inv_[std::size_t(h)];
      for (Index c = 0; c < Dv; ++c) row[c] *= inv;
      row_from_f32(row, Dv, o.row(b, h0 + h, t));
    }
  }

 private:
  // Row h's 1 / l (0 when it has no key and no sink) and its LSE.
  void norm(Index h, float m, float l, float* lse, Index lse_stride) {
    if (inv_.size() <= std::size_t(h)) inv_.resize(std::size_t(h + 1));
    inv_[std::size_t(h)] = l > 0.f ? 1.f / l : 0.f;
    if (lse != nullptr)
      lse[h * lse_stride] = l > 0.f ? m + std::log(l) : -std::numeric_limits<float>::infinity();
  }
  static void size(std::vector<float>& x, Index n) {
    if (x.size() < std::size_t(n)) x.resize(std::size_t(n));
  }
  std::vector<Index> rows_;
  std::vector<float> kt_, vg_, qs_, s_, og_, tile_, inv_;
};

}  // namespace attnkit::detail
