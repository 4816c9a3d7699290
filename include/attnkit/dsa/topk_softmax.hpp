// TopkSoftmax: topk_attention()'s engine for plain softmax over Dot scores (sinks allowed), one
// (batch, query, KV head) at a time, for the G query heads that read the KV head, with the
// selected K and V rows read where they lie (dsa/selected_rows.hpp) by the tile GEMM:
//   S^T [n, G] = K_sel (scale Q)^T     (the heads in the lanes),
//   P^T = exp(S^T - m) down each head's lane (m with the sink), l = its sum,
//   O [G, Dv] = P V_sel / l            (P read down the lanes: A's column stride G).
// n (D + Dv) G multiply-adds and no gather: gathering the keys transposed first had cost 40%
// of the call (16 heads over one KV head of 128, L 4096, top k 1024, on an Intel Xeon).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/dsa/selected_rows.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

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
    const Index G = heads, W = simd::kWidth, Gp = simd::round_up(G);
    Index n = 0;
    rows_.resize(std::size_t(topk));
    for (Index i = 0; i < topk; ++i)
      if (keys[i] >= 0) rows_[std::size_t(n++)] = keys[i];
    // MLA's latent: V a view of K's first Dv values (the same rows): one row serves both.
    const bool latent = static_cast<const void*>(v.data) == static_cast<const void*>(k.data) &&
                        v.seq_stride == k.seq_stride && v.head_stride == k.head_stride &&
                        v.batch_stride == k.batch_stride && Dv <= D &&
                        std::is_same_v<std::remove_const_t<K>, std::remove_const_t<V>>;
    // The selected rows where they lie (f32) or widened once; V's rows are read to whole
    // vectors of columns (MLA's latent: K's rows, D >= round_up(Dv) or widened to round_up(D)).
    keys_.take(k, b, g, rows_.data(), n, latent);
    if (!latent) values_.take(v, b, g, rows_.data(), n, true);
    const float* const* vrows = latent ? keys_.rows() : values_.rows();
    // qt_ [D, Gp] = (scale Q)^T: the heads in the lanes.
    size(qt_, D * Gp);
    size(qs_, ldd);
    std::fill(qt_.begin(), qt_.begin() + D * Gp, 0.f);
    for (Index h = 0; h < G; ++h) {
      pack_rows(q, b, h0 + h, t, 1, qs_.data(), ldd);
      for (Index d = 0; d < D; ++d) qt_[std::size_t(d * Gp + h)] = scale * qs_[std::size_t(d)];
    }
    // st_ [n, Gp] = S^T = K_sel (scale Q)^T, then P^T in place, each head's softmax down its lane.
    size(st_, n * Gp);
    if (n > 0)
      gemm::gemm(n, Gp, D, gemm::RowsA{keys_.rows()}, gemm::StridedB{qt_.data(), Gp}, st_.data(),
                 Gp, false);
    using simd::Vec;
    const float inf = std::numeric_limits<float>::infinity();
    size(m_, Gp);
    size(l_, Gp);
    for (Index c = 0; c < Gp; c += W) {
      for (Index h = c; h < c + W; ++h)
        m_[std::size_t(h)] = sinks != nullptr && h < G ? sinks[h] : -inf;
      Vec mv = simd::load(m_.data() + c);
      for (Index j = 0; j < n; ++j) mv = simd::max(mv, simd::load(st_.data() + j * Gp + c));
      simd::store(m_.data() + c, mv);
      const Vec mm = simd::zero_if_neg_inf(mv);
      const Vec log2e(1.4426950408889634f);
      Vec lv(0.f);
      for (Index j = 0; j < n; ++j) {
        float* x = st_.data() + j * Gp + c;
        const Vec p = simd::exp2((simd::load(x) - mm) * log2e);
        simd::store(x, p);
        lv = lv + p;
      }
      simd::store(l_.data() + c, lv);
    }
    for (Index h = 0; h < G; ++h) {
      const float m = m_[std::size_t(h)];
      float l = l_[std::size_t(h)];
      if (sinks != nullptr) l += std::exp(sinks[h] - m);
      norm(h, m, l, lse, lse_stride);
    }
    // og_ [G, ldv] = P V_sel: P read down st_'s lanes, V's rows in place.
    size(og_, G * ldv);
    if (n > 0)
      gemm::gemm(G, ldv, n, gemm::StridedA{st_.data(), 1, Gp}, gemm::RowsB{vrows}, og_.data(), ldv,
                 false);
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
  SelectedRows keys_, values_;
  std::vector<float> qs_, qt_, st_, m_, l_, og_, inv_;
};

}  // namespace attnkit::detail
