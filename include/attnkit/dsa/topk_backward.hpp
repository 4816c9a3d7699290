// topk_attention_backward(): dq, dk, dv of topk_attention() (softmax over Dot scores), in
// two passes that each own what they write, so the result is the same for any thread count,
// with the selected K and V rows read where they lie (dsa/selected_rows.hpp) and, as in the
// forward engine, the group's heads in the lanes:
// - per (batch, query, KV head), over its selected keys:
//     S^T = K_sel (scale Q)^T, P^T = exp(S^T - lse), dP^T = V_sel dO^T, dS^T = P^T . (dP^T - D),
//     dQ = scale dS K_sel     (D = rowsum(o . dO), the forward's LSE)
// - per (batch, KV head, range of kKeyRange keys), every query in order, its selected keys
//   inside the range (a binary search in its sorted keys), the same P^T and dS^T, then
//     dK += scale dS^T Q, dV += P^T dO   (the range's rows, summed over the group's heads)
// The ranges are fixed by the shape, not the thread count. Pairs are recomputed once per
// pass: about 7 products a pair and head against the forward's 2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnkit/detail/parallel.hpp"
#include "attnkit/dsa/selected_rows.hpp"
#include "attnkit/dsa/topk_checks.hpp"
#include "attnkit/dsa/topk_softmax.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/attention_backward.hpp"
#include "attnkit/normalizer/softmax.hpp"
#include "attnkit/score/dot.hpp"
#include "attnkit/select/gather.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {
namespace detail {

/// One worker's buffers and the pair math both passes share.
class TopkPairs {
 public:
  static constexpr Index kKeyRange = 512;  // keys a pass-B item owns

  /// The G query rows (heads h0 ..) of query t over the n keys keys[0, n) of KV head g:
  /// qs_ = scale q [G, ldd] and do_ [G, ldv] as rows, then P^T (in pt_) and dS^T (in dst_),
  /// [n, Gp] with the heads in the lanes. `k_whole`: K's rows kept readable to ldd columns
  /// (keys(), for dQ = dS K_sel).
  template <class Q, class K, class V, class GO>
  void pairs(const View<Q>& q, const View<K>& k, const View<V>& v, const View<GO>& d_o, Index b,
             Index h0, Index g, Index t, Index G, const Index* keys, Index n, bool k_whole,
             float scale, const float* lse, const float* delta, Index stride) {
    const Index D = q.dim, Dv = v.dim, W = simd::kWidth;
    ldd_ = simd::round_up(D);
    ldv_ = simd::round_up(Dv);
    Gp_ = simd::round_up(G);
    keys_.take(k, b, g, keys, n, k_whole);
    values_.take(v, b, g, keys, n, false);
    size(qs_, G * ldd_);
    size(do_, G * ldv_);
    size(qt_, D * Gp_);
    size(dot_, Dv * Gp_);
    heads_in_lanes(q, b, h0, t, G, scale, qs_.data(), ldd_, qt_.data(), Gp_);
    heads_in_lanes(d_o, b, h0, t, G, 1.f, do_.data(), ldv_, dot_.data(), Gp_);
    size(pt_, n * Gp_);
    size(dst_, n * Gp_);
    size(m_, Gp_);
    size(d_, Gp_);
    if (n == 0) return;
    gemm::gemm(n, Gp_, D, gemm::RowsA{keys_.rows()}, gemm::StridedB{qt_.data(), Gp_}, pt_.data(),
               Gp_, false);
    gemm::gemm(n, Gp_, Dv, gemm::RowsA{values_.rows()}, gemm::StridedB{dot_.data(), Gp_},
               dst_.data(), Gp_, false);
    for (Index h = 0; h < Gp_; ++h) {  // the padding lanes: P = 0
      const float l = h < G ? lse[h * stride] : std::numeric_limits<float>::infinity();
      m_[std::size_t(h)] = std::isfinite(l) || h >= G ? l : 0.f;
      d_[std::size_t(h)] = h < G ? delta[h * stride] : 0.f;
    }
    using simd::Vec;
    const Vec log2e(1.4426950408889634f);
    for (Index c = 0; c < Gp_; c += W) {
      const Vec m = simd::load(m_.data() + c), d = simd::load(d_.data() + c);
      for (Index j = 0; j < n; ++j) {
        float *p = pt_.data() + j * Gp_ + c, *ds = dst_.data() + j * Gp_ + c;
        const Vec x = simd::exp2((simd::load(p) - m) * log2e);
        simd::store(p, x);
        simd::store(ds, x * (simd::load(ds) - d));
      }
    }
  }

  /// The selected keys' table (readable to ldd_ columns when pairs() was asked k_whole).
  const float* const* keys() const { return keys_.rows(); }

  Index ldd_ = 0, ldv_ = 0, Gp_ = 0;
  std::vector<float> qs_, do_, qt_, dot_, pt_, dst_, m_, d_, out_;

 private:
  static void size(std::vector<float>& x, Index n) {
    if (x.size() < std::size_t(n)) x.resize(std::size_t(n));
  }
  SelectedRows keys_, values_;
};

}  // namespace detail

/// The gradients of o = topk_attention(spec, q, k, v, o, keys, options) for a loss whose
/// gradient in o is d_o: dq [B, Hq, Lq, D], dk [B, Hkv, Lk, D], dv [B, Hkv, Lk, Dv] (keys no
/// query selected get 0). Softmax (no sinks) over Dot scores; `o` and options.lse are the
/// forward's (Options::with_lse on both calls), as are scale and q_offset. Throws Error
/// before writing anything on bad input; the same bits for any thread count.
template <class Spec, class Q, class K, class V, class O, class GO, class GQ, class GK, class GV>
void topk_attention_backward(const Spec& spec, const View<Q>& q, const View<K>& k, const View<V>& v,
                             const View<O>& o, const View<GO>& d_o, const View<GQ>& dq,
                             const View<GK>& dk, const View<GV>& dv, const TopkKeys& keys,
                             const Options& options = {}) {
  static_assert(std::is_same_v<typename Spec::Score, Dot> &&
                    std::is_same_v<typename Spec::Normalizer, Softmax>,
                "topk_attention_backward(): softmax over Dot scores");
  select::check_gathered_spec<Spec>();
  const Problem p = detail::make_backward_problem(spec, q, k, v, o, d_o, dq, dk, dv, options, {});
  detail::require(spec.normalizer.sinks.empty(), "spec.normalizer.sinks",
                  "empty (topk_attention_backward has no sink gradient)", "sinks");
  detail::check_topk_keys(keys, p, o);
  const std::vector<float> delta = detail::row_deltas(p, o, d_o);
  const float* lse = options.lse.data();
  const Index group = p.q_heads / p.kv_heads, topk = keys.indices.dim;
  // Each query's selected keys, sorted: [B, Lq] rows of up to topk.
  std::vector<Index> sorted(std::size_t(p.batch * p.q_len * topk));
  std::vector<Index> counts(std::size_t(p.batch * p.q_len));
  const int threads = detail::thread_count(options.threads);
  detail::parallel_for(threads, p.batch * p.q_len, 64, [&](Index row) {
    const std::int32_t* x = keys.indices.row(row / p.q_len, 0, row % p.q_len);
    Index* out = sorted.data() + row * topk;
    Index n = 0;
    for (Index i = 0; i < topk; ++i)
      if (x[i] >= 0) out[n++] = x[i];
    std::sort(out, out + n);
    counts[std::size_t(row)] = n;
  });
  std::vector<detail::TopkPairs> pool(std::size_t(std::max(threads, 1)));
  const auto mine = [&]() -> detail::TopkPairs& {
#ifdef _OPENMP
    return pool[std::size_t(omp_get_thread_num())];
#else
    return pool.front();
#endif
  };
  // Pass A: dq, per (batch, query, KV head).
  detail::parallel_for(threads, p.batch * p.q_len * p.kv_heads, 4, [&](Index item) {
    detail::TopkPairs& w = mine();
    const Index g = item % p.kv_heads, row = item / p.kv_heads;
    const Index b = row / p.q_len, t = row % p.q_len, h0 = g * group;
    const Index n = counts[std::size_t(row)];
    const Index stat = (b * p.q_heads + h0) * p.q_len + t;
    w.pairs(q, k, v, d_o, b, h0, g, t, group, sorted.data() + row * topk, n, true, p.scale,
            lse + stat, delta.data() + stat, p.q_len);
    w.out_.resize(std::size_t(group * w.ldd_));
    if (n > 0)
      gemm::gemm(group, w.ldd_, n, gemm::StridedA{w.dst_.data(), 1, w.Gp_}, gemm::RowsB{w.keys()},
                 w.out_.data(), w.ldd_, false);
    else
      std::fill(w.out_.begin(), w.out_.end(), 0.f);
    for (Index h = 0; h < group; ++h) {
      float* r = w.out_.data() + h * w.ldd_;
      for (Index c = 0; c < p.head_dim; ++c) r[c] *= p.scale;
      detail::row_from_f32(r, p.head_dim, dq.row(b, h0 + h, t));
    }
  });
  // Pass B: dk, dv, per (batch, KV head, range of keys).
  const Index R = detail::TopkPairs::kKeyRange, ranges = (p.kv_len + R - 1) / R;
  detail::parallel_for(threads, p.batch * p.kv_heads * ranges, 1, [&](Index item) {
    detail::TopkPairs& w = mine();
    const Index range = item % ranges, g = item / ranges % p.kv_heads,
                b = item / ranges / p.kv_heads, h0 = g * group;
    const Index lo = range * R, hi = std::min(p.kv_len, lo + R), nr = hi - lo;
    const Index ldd = simd::round_up(p.head_dim), ldv = simd::round_up(p.value_dim);
    std::vector<float> dk_r(std::size_t(nr * ldd), 0.f), dv_r(std::size_t(nr * ldv), 0.f);
    std::vector<float> tk, tv;
    for (Index t = 0; t < p.q_len; ++t) {
      const Index row = b * p.q_len + t;
      const Index* first = sorted.data() + row * topk;
      const Index* last = first + counts[std::size_t(row)];
      const Index* a = std::lower_bound(first, last, lo);
      const Index* e = std::lower_bound(a, last, hi);
      const Index m = Index(e - a);
      if (m == 0) continue;
      const Index stat = (b * p.q_heads + h0) * p.q_len + t;
      w.pairs(q, k, v, d_o, b, h0, g, t, group, a, m, false, p.scale, lse + stat,
              delta.data() + stat, p.q_len);
      // dK rows = dS^T (scale Q) (qs_ holds scale q), dV rows = P^T dO.
      tk.resize(std::size_t(m * ldd));
      tv.resize(std::size_t(m * ldv));
      gemm::gemm(m, ldd, group, {w.dst_.data(), w.Gp_, 1}, w.qs_.data(), ldd, tk.data(), ldd,
                 false);
      gemm::gemm(m, ldv, group, {w.pt_.data(), w.Gp_, 1}, w.do_.data(), ldv, tv.data(), ldv, false);
      for (Index j = 0; j < m; ++j) {
        float* to_k = dk_r.data() + (a[j] - lo) * ldd;
        float* to_v = dv_r.data() + (a[j] - lo) * ldv;
        for (Index c = 0; c < ldd; ++c) to_k[c] += tk[std::size_t(j * ldd + c)];
        for (Index c = 0; c < ldv; ++c) to_v[c] += tv[std::size_t(j * ldv + c)];
      }
    }
    for (Index j = 0; j < nr; ++j) {
      detail::row_from_f32(dk_r.data() + j * ldd, p.head_dim, dk.row(b, g, lo + j));
      detail::row_from_f32(dv_r.data() + j * ldv, p.value_dim, dv.row(b, g, lo + j));
    }
  });
}

}  // namespace attnkit
