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

/// Decode's slices (topk_attention): with fewer (batch, query, KV head) items than
/// kTopkSliceBelow, each item's keys are cut into slices of kTopkSliceKeys selection entries,
/// computed apart (on any thread) and merged in order.
inline constexpr Index kTopkSliceKeys = 512;
inline constexpr Index kTopkSliceBelow = 8;

/// Where a slice's partial result lies in a block of floats: for the G heads, o [G, ldv]
/// (sum_j exp(s_j - m) v_j, not yet divided), then m [Gp] and l [Gp] = sum_j exp(s_j - m)
/// (no sink: m -inf and l 0 over no key).
struct TopkPart {
  Index G, ldv, Gp;
  TopkPart(Index heads, Index value_dim)
      : G(heads), ldv(simd::round_up(value_dim)), Gp(simd::round_up(heads)) {}
  Index size() const { return G * ldv + 2 * Gp; }
  Index m() const { return G * ldv; }
  Index l() const { return G * ldv + Gp; }
};

/// Heads h0 .. h0 + G of x at query t (batch b), times `scale`: as rows into rows [G, ld]
/// (zero past x.dim) and transposed into lanes [x.dim, Gp] (lane h: head h0 + h; lanes past G
/// zero): the layout of the DSA engines, the heads in the SIMD lanes.
template <class T>
void heads_in_lanes(const View<T>& x, Index b, Index h0, Index t, Index G, float scale, float* rows,
                    Index ld, float* lanes, Index Gp) {
  std::fill(lanes, lanes + x.dim * Gp, 0.f);
  for (Index h = 0; h < G; ++h) {
    float* row = rows + h * ld;
    pack_rows(x, b, h0 + h, t, 1, row, ld);
    for (Index c = 0; c < ld; ++c) row[c] *= scale;
    for (Index c = 0; c < x.dim; ++c) lanes[c * Gp + h] = row[c];
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
    const TopkPart part(heads, v.dim);
    size(part_, part.size());
    partial(q, k, v, b, h0, t, heads, g, keys, topk, scale, part_.data());
    finish(part_.data(), 1, part.size(), part, sinks, o, b, h0, t, lse, lse_stride);
  }

  /// run()'s products over one slice of the keys, into `out` (a TopkPart(heads, v.dim) block).
  template <class Q, class K, class V>
  void partial(const View<Q>& q, const View<K>& k, const View<V>& v, Index b, Index h0, Index t,
               Index heads, Index g, const std::int32_t* keys, Index topk, float scale,
               float* out) {
    const Index D = q.dim, Dv = v.dim, ldd = simd::round_up(D);
    const TopkPart part(heads, Dv);
    const Index G = heads, W = simd::kWidth, Gp = part.Gp, ldv = part.ldv;
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
    size(qs_, G * ldd);
    heads_in_lanes(q, b, h0, t, G, scale, qs_.data(), ldd, qt_.data(), Gp);
    // st_ [n, Gp] = S^T = K_sel (scale Q)^T, then P^T in place, each head's softmax down its lane.
    size(st_, n * Gp);
    if (n > 0)
      gemm::gemm(n, Gp, D, gemm::RowsA{keys_.rows()}, gemm::StridedB{qt_.data(), Gp}, st_.data(),
                 Gp, false);
    using simd::Vec;
    float *m = out + part.m(), *l = out + part.l();
    for (Index c = 0; c < Gp; c += W) {
      Vec mv(-std::numeric_limits<float>::infinity());
      for (Index j = 0; j < n; ++j) mv = simd::max(mv, simd::load(st_.data() + j * Gp + c));
      simd::store(m + c, mv);
      const Vec mm = simd::zero_if_neg_inf(mv), log2e(1.4426950408889634f);
      Vec lv(0.f);
      for (Index j = 0; j < n; ++j) {
        float* x = st_.data() + j * Gp + c;
        const Vec p = simd::exp2((simd::load(x) - mm) * log2e);
        simd::store(x, p);
        lv = lv + p;
      }
      simd::store(l + c, lv);
    }
    // o [G, ldv] = P V_sel: P read down st_'s lanes, V's rows in place.
    if (n > 0)
      gemm::gemm(G, ldv, n, gemm::StridedA{st_.data(), 1, Gp}, gemm::RowsB{vrows}, out, ldv, false);
    else
      std::fill(out, out + G * ldv, 0.f);
  }

  /// o's rows (heads h0 .. h0 + G at query t) and, if given, lse[h * lse_stride] from `parts`
  /// slices' partial results (TopkPart blocks, one after another), merged in order with the
  /// sinks: M = max(sink, m_s), L = exp(sink - M) + sum_s exp(m_s - M) l_s,
  /// o = sum_s exp(m_s - M) o_s / L (0, LSE -inf, with no key and no sink).
  template <class O>
  void finish(const float* in, Index parts, Index stride, const TopkPart& part, const float* sinks,
              const View<O>& o, Index b, Index h0, Index t, float* lse, Index lse_stride) {
    const float inf = std::numeric_limits<float>::infinity();
    const Index Dv = o.dim, ldv = part.ldv, W = simd::kWidth;
    size(row_, ldv);
    size(w_, parts);
    for (Index h = 0; h < part.G; ++h) {
      float M = sinks != nullptr ? sinks[h] : -inf;
      for (Index s = 0; s < parts; ++s) M = std::max(M, in[s * stride + part.m() + h]);
      float L = sinks != nullptr && M > -inf ? std::exp(sinks[h] - M) : 0.f;
      for (Index s = 0; s < parts; ++s) {
        const float ms = in[s * stride + part.m() + h];
        w_[std::size_t(s)] = ms > -inf ? std::exp(ms - M) : 0.f;
        L += w_[std::size_t(s)] * in[s * stride + part.l() + h];
      }
      const float inv = L > 0.f ? 1.f / L : 0.f;
      for (Index c = 0; c < ldv; c += W) {
        simd::Vec acc(0.f);
        for (Index s = 0; s < parts; ++s)
          acc = simd::fma(simd::load(in + s * stride + h * ldv + c),
                          simd::Vec(w_[std::size_t(s)] * inv), acc);
        simd::store(row_.data() + c, acc);
      }
      row_from_f32(row_.data(), Dv, o.row(b, h0 + h, t));
      if (lse != nullptr) lse[h * lse_stride] = L > 0.f ? M + std::log(L) : -inf;
    }
  }

 private:
  static void size(std::vector<float>& x, Index n) {
    if (x.size() < std::size_t(n)) x.resize(std::size_t(n));
  }
  std::vector<Index> rows_;
  SelectedRows keys_, values_;
  std::vector<float> qs_, qt_, st_, part_, row_, w_;
};

}  // namespace attnkit::detail
