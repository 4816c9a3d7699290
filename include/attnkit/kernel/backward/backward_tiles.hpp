// BackwardTiles: the per-thread engine of attention_backward(). One item is a KV head of one
// batch (b, hk) with every query head of its group, so the thread that runs it owns dK and dV
// of those keys and dQ of those queries: no two threads add into the same gradient, and the
// order of every sum is fixed, whatever the thread count (bitwise identical results).
// For each query head g of the group and each query tile (64 rows), the key tiles the
// forward's schedule visits (same tiles, same Full / Partial kinds) are recomputed and turned
// into gradients (FlashAttention-2's scheme; the logit tile is transposed as in the forward,
// S^T[keys, queries], a SIMD lane per query):
//   S^T  = K Q^T                    (scale folded into Q; cosines: / |k|, Q normalized)
//   score mods, mask; P = weights rebuilt from the forward's row statistic
//   dP^T = V dO^T;  dS = the normalizer's backward (softmax: P (dP - D), D_i = dO_i . O_i)
//   dV  += P^T dO,  dK += dS^T Q,  dQ_tile += dS K
// A normalizer whose dS needs sums over the whole row first (LSSAR: kBackwardPasses = 3) gets
// passes before that one over the same key tiles, which recompute S^T (and dP^T where the pass
// reads it) and keep only row statistics (kernel/backward/backward_rows.hpp); for the others the
// pass loop is compiled out. dQ of a tile is finished after its key tiles, dK and dV after the
// whole item (in scratch [Lk, D] per thread, kernel/backward/backward_keys.hpp); both are stored by
// kernel/backward/backward_store.hpp: turned rows (RoPE) get their gradients turned back by the
// transposed rotation, cosine logits the projection of the normalization's derivative.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/backward/backward_keys.hpp"
#include "attnkit/kernel/backward/backward_rows.hpp"
#include "attnkit/kernel/backward/backward_stages.hpp"
#include "attnkit/kernel/backward/backward_store.hpp"
#include "attnkit/kernel/backward/backward_traits.hpp"
#include "attnkit/kernel/tiles/owned_products.hpp"
#include "attnkit/kernel/tiles/pack.hpp"
#include "attnkit/kernel/tiles/query_row.hpp"
#include "attnkit/kernel/tiles/row_norms.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/kernel/tiles/tile_mask.hpp"
#include "attnkit/kernel/tiles/value_guard.hpp"
#include "attnkit/mask/key_schedule.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit::detail {

template <class Spec, class Q, class K, class V, class GO, class GQ, class GK, class GV, class KR>
class BackwardTiles {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ;
  static constexpr Index kBk = TileConfig::kBlockK;
  using Normalizer = typename Spec::Normalizer;
  static constexpr int kPasses = backward_passes<Normalizer>();
  static constexpr bool kCosine = cosine_logits<Normalizer>();
  static constexpr bool kTurnsRows = transforms_rows<typename Spec::Position>();
  static constexpr bool kScoreTile = !unit_derivative<typename Spec::Score>();
  static constexpr bool kOwnsProduct = owns_product<typename Spec::Position>();

  /// k: the keys as the tiles read them (turned once per call by a row-transforming
  /// Position), k_raw: the caller's keys (for a Position's parameter gradient); stat: the forward's
  /// row statistics, delta: D_i, key_scale: the keys' inverse norms (cosine logits), each indexed
  /// like the row statistics / [B, Hkv, Lk].
  BackwardTiles(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                const View<V>& v, const View<GO>& d_o, const View<GQ>& dq, const View<GK>& dk,
                const View<GV>& dv, const View<KR>& k_raw, const float* stat, const float* delta,
                const float* key_scale)
      : spec_(spec),
        p_(p),
        q_(q),
        k_(k),
        v_(v),
        d_o_(d_o),
        dq_(dq),
        dk_(dk),
        dv_(dv),
        k_raw_(k_raw),
        stat_(stat),
        delta_(delta),
        key_scale_(key_scale),
        d_pad_(simd::round_up(p.head_dim)),
        dv_pad_(simd::round_up(p.value_dim)),
        k_direct_(is_f32<K>() && d_pad_ == p.head_dim),
        v_direct_(is_f32<V>()),
        scratch_(Scratch::size_for(
            p.kv_len * d_pad_, p.kv_len * dv_pad_, p.head_dim * kBq, kBq * d_pad_,
            p.value_dim * kBq, kBq * dv_pad_, kBk * kBq, kBk * kBq, kScoreTile ? kBk * kBq : 0,
            k_direct_ ? 0 : kBk * d_pad_, v_direct_ ? 0 : kBk * dv_pad_, kBq * d_pad_, d_pad_, kBq,
            kBq, kBq, kBq, kOwnsProduct ? OwnedProducts::floats(d_pad_) : 0)),
        own_k_(scratch_.carve(p.kv_len * d_pad_)),
        own_v_(scratch_.carve(p.kv_len * dv_pad_)),
        qt_(scratch_.carve(p.head_dim * kBq)),
        qrow_(scratch_.carve(kBq * d_pad_)),
        dot_(scratch_.carve(p.value_dim * kBq)),
        dorow_(scratch_.carve(kBq * dv_pad_)),
        s_(scratch_.carve(kBk * kBq)),
        dp_(scratch_.carve(kBk * kBq)),
        g_(kScoreTile ? scratch_.carve(kBk * kBq) : nullptr),
        kp_(k_direct_ ? nullptr : scratch_.carve(kBk * d_pad_)),
        vp_(v_direct_ ? nullptr : scratch_.carve(kBk * dv_pad_)),
        dq_tile_(scratch_.carve(kBq * d_pad_)),
        row_(scratch_.carve(d_pad_)),
        lane_grad_(scratch_.carve(kBq)),
        inv_q_(scratch_.carve(kBq)),
        counts_(scratch_.carve(kBq)),
        lanes_(scratch_.carve(kBq)),
        rows_(kBq) {
    acc_.d_pad = d_pad_, acc_.dv_pad = dv_pad_;
    if constexpr (kOwnsProduct)
      owned_ = OwnedProducts(scratch_.carve(OwnedProducts::floats(d_pad_)), d_pad_);
  }

  /// dK, dV of KV head hk in batch b and dQ of its query heads; head_grad[g] += the normalizer's
  /// per-head parameter gradient of the group's g-th head on this batch's rows, and
  /// position_grad (when not null) += the Position's parameter gradient of these rows.
  void run(Index b, Index hk, double* head_grad, double* position_grad) {
    run_part(b, hk, 0, (p_.q_len + kBq - 1) / kBq, head_grad, position_grad, own_k_, own_v_);
    acc_.reach(p_.kv_len);  // keys no tile reached: zero gradients
    write_keys(b, hk);
  }

  /// run() on query tiles [t0, t1) of each query head of the group only (a part of the item,
  /// attention_backward.hpp), their dK and dV into part_k [Lk, d_pad] and part_v [Lk, dv_pad]
  /// (finish_keys() sums the parts); head_grad[g] += the parameter gradient of the group's
  /// g-th head on these rows. Returns the rows of part_k / part_v written: keys past them were
  /// reached by no tile (their rows hold garbage, not zeros).
  Index run_part(Index b, Index hk, Index t0, Index t1, double* head_grad, double* position_grad,
                 float* part_k, float* part_v) {
    position_grad_ = position_grad;
    acc_.begin(part_k, part_v);
    const Index group = p_.q_heads / p_.kv_heads;
    for (Index g = 0; g < group; ++g)
      for (Index t = t0; t < t1; ++t)
        head_grad[g] +=
            query_tile(b, hk * group + g, hk, t * kBq, std::min(kBq, p_.q_len - t * kBq));
    return acc_.zeroed;
  }

  /// dK, dV of KV head hk in batch b: the `parts` parts of run_part() (part_k, part_v: the
  /// first of them, one after another; written[s] rows of part s) summed in part order, then
  /// stored; position_grad (when not null) += the Position's parameter gradient of the keys.
  void finish_keys(Index b, Index hk, const float* part_k, const float* part_v, Index parts,
                   const Index* written, double* position_grad) {
    position_grad_ = position_grad;
    acc_.begin(own_k_, own_v_);
    acc_.sum_parts(part_k, part_v, parts, p_.kv_len, written);
    write_keys(b, hk);
  }

 private:
  // dQ of rows [q0, q0 + nq) of head h, their share of dK and dV; returns their parameter
  // gradient.
  double query_tile(Index b, Index h, Index hk, Index q0, Index nq) {
    const Index lanes = simd::round_up(nq);
    const Range q_pos{q0 + p_.q_offset, q0 + nq + p_.q_offset};
    pack_queries(b, h, q0, nq, lanes);
    if constexpr (kOwnsProduct)
      owned_.split_queries(qrow_, nq, spec_.position.amplitude_dims(p_.head_dim));
    pack_q_transposed(d_o_, b, h, q0, nq, lanes, 1.f, dot_, kBq);  // dot_ [Dv, kBq]
    pack_rows(d_o_, b, h, q0, nq, dorow_, dv_pad_);                // dorow_ [nq, dv_pad]
    set_aside_nonfinite_rows(dorow_, nq, dv_pad_, bad_rows_, bad_do_);
    rows_.begin(spec_.normalizer, spec_.mask, p_, stat_, delta_, b, h, q0, nq, lanes, q_pos.begin,
                counts_);
    std::fill(dq_tile_, dq_tile_ + kBq * d_pad_, 0.f);
    std::fill(lane_grad_, lane_grad_ + kBq, 0.f);
    if constexpr (kPasses > 1) observe_passes(b, h, hk, q_pos, nq, lanes);
    for_each_key_tile(spec_.mask, b, h, q_pos, p_.kv_len, kBk, [&](Range kv, TileKind kind) {
      key_tile(b, h, hk, q_pos.begin, kv.begin, kv.end - kv.begin, nq, lanes, kind);
    });
    finish_queries(b, h, q0, nq);
    double grad = 0.0;
    for (Index r = 0; r < nq; ++r) grad += double(lane_grad_[r]);
    return grad + rows_.row_param_grad(spec_.normalizer, nq, lanes, lanes_);  // sinks
  }

  // The passes before the last (LSSAR: its row sums W_i, then E_i = sum_j a_ij da_ij): the
  // last pass's key tiles, each one's logits -- and dP where the pass reads it -- handed to the
  // normalizer, which keeps row statistics only.
  void observe_passes(Index b, Index h, Index hk, Range q_pos, Index nq, Index lanes) {
    for (int pass = 0; pass + 1 < kPasses; ++pass) {
      const bool reads_dp = Normalizer::backward_pass_reads_dp(pass);
      for_each_key_tile(spec_.mask, b, h, q_pos, p_.kv_len, kBk, [&](Range kv, TileKind kind) {
        const Index k0 = kv.begin, nk = kv.end - kv.begin;
        logits(b, h, hk, q_pos.begin, k0, nk, nq, lanes, kind, false);
        if (reads_dp) value_products(b, hk, k0, nk, lanes);
        if (kind == TileKind::Partial || nq < lanes)
          drop_masked(s_, reads_dp ? dp_ : nullptr, kBq, nk, nq, lanes);
        rows_.observe(spec_.normalizer, pass, s_, reads_dp ? dp_ : nullptr, nk, lanes, kBq);
      });
      rows_.end_pass(spec_.normalizer, pass, lanes);
    }
  }

  // qt_ [D, kBq] and qrow_ [nq, d_pad]: the rows turned by the Position, times the scale (or
  // normalized, for cosine logits: inv_q_ keeps 1 / |q|).
  void pack_queries(Index b, Index h, Index q0, Index nq, Index lanes) {
    const Index dim = p_.head_dim;
    for (Index r = 0; r < nq; ++r) {
      float* x = qrow_ + r * d_pad_;
      const RowAt at{b, h, q0 + r, p_.q_len, q0 + r + p_.q_offset, Role::Query};
      inv_q_[r] = query_row(spec_, p_, q_.row(b, h, q0 + r), at, x);
      std::fill(x + dim, x + d_pad_, 0.f);
      for (Index c = 0; c < dim; ++c) qt_[c * kBq + r] = x[c];
    }
    for (Index c = 0; c < dim; ++c) std::fill(qt_ + c * kBq + nq, qt_ + c * kBq + lanes, 0.f);
  }

  // s_ [nk, kBq]: the logits of keys [k0, k0 + nk) as the forward forms them (cosines: / |k|),
  // the Score's mods (and its derivative in g_, with_derivative), the mask; returns the keys.
  F32Rows logits(Index b, Index h, Index hk, Index i0, Index k0, Index nk, Index nq, Index lanes,
                 TileKind kind, bool with_derivative) {
    const F32Rows keys = f32_rows(k_, k_direct_, b, hk, k0, nk, kp_, d_pad_);
    if constexpr (kOwnsProduct)
      owned_.logits(spec_.position, keys, qt_, nk, lanes, i0, k0, p_.head_dim, s_);
    else
      gemm::gemm(nk, lanes, p_.head_dim, {keys.data, keys.ld, 1}, qt_, kBq, s_, kBq, false);
    if constexpr (kCosine) scale_rows(s_, kBq, key_norms(b, hk, k0), nk, lanes);
    const ScoreTile where{b, h, i0, k0};
    if constexpr (has_apply_tile<typename Spec::Score>::value)
      spec_.score.apply_tile(s_, nk, lanes, kBq, where);
    if constexpr (kScoreTile)
      if (with_derivative) spec_.score.derivative_tile(s_, g_, nk, lanes, kBq, where);
    (void)with_derivative;
    if (kind == TileKind::Partial)
      mask_partial_tile(spec_.mask, s_, kBq, b, h, i0, k0, nk, nq, lanes);
    return keys;
  }

  // dp_ [nk, kBq] = V dO^T over keys [k0, k0 + nk).
  void value_products(Index b, Index hk, Index k0, Index nk, Index lanes) {
    const F32Rows values = f32_rows(v_, v_direct_, b, hk, k0, nk, vp_, dv_pad_);
    gemm::gemm(nk, lanes, p_.value_dim, {values.data, values.ld, 1}, dot_, kBq, dp_, kBq, false);
  }

  // The last pass over one key tile: P and dS, then the gradients' products.
  void key_tile(Index b, Index h, Index hk, Index i0, Index k0, Index nk, Index nq, Index lanes,
                TileKind kind) {
    acc_.reach(k0 + nk);
    const F32Rows keys = logits(b, h, hk, i0, k0, nk, nq, lanes, kind, true);
    value_products(b, hk, k0, nk, lanes);
    if (kind == TileKind::Partial || nq < lanes) drop_masked(s_, dp_, kBq, nk, nq, lanes);
    rows_.backward(spec_.normalizer, s_, dp_, nk, lanes, kBq, lane_grad_);
    if (kind == TileKind::Partial && !bad_rows_.empty())
      zero_unseen_grads(spec_.mask, bad_rows_, b, h, i0, k0, nk, dp_, kBq);
    if constexpr (kScoreTile)  // dS on the raw logit: times d(modified) / d(raw)
      for (Index jj = 0; jj < nk; ++jj)
        for (Index c = 0; c < lanes; c += simd::kWidth)
          simd::store(dp_ + jj * kBq + c,
                      simd::load(dp_ + jj * kBq + c) * simd::load(g_ + jj * kBq + c));
    if constexpr (kCosine) scale_rows(dp_, kBq, key_norms(b, hk, k0), nk, lanes);
    gemm::gemm(nk, dv_pad_, nq, {s_, kBq, 1}, dorow_, dv_pad_, acc_.v + k0 * dv_pad_, dv_pad_,
               true);  // dV += P^T dO
    if (!bad_rows_.empty())
      add_rows_to_seen_keys(spec_.mask, kind == TileKind::Full, bad_rows_, bad_do_.data(), b, h, i0,
                            k0, nk, s_, kBq, acc_.v, dv_pad_);
    if constexpr (kOwnsProduct) {  // dS splits into the two products' gradients
      owned_.backward(spec_.position, dp_, nk, nq, lanes, i0, k0, p_.head_dim,
                      acc_.k + k0 * d_pad_);
      const Index a = spec_.position.amplitude_dims(p_.head_dim);
      add_query_grads(owned_.keys_amp(keys, nk, a), dp_, b, h, i0, k0, nk, nq, kind);
      add_query_grads(owned_.keys_phase(), owned_.ds2(), b, h, i0, k0, nk, nq, kind);
      return;
    }
    gemm::gemm(nk, d_pad_, nq, {dp_, kBq, 1}, qrow_, d_pad_, acc_.k + k0 * d_pad_, d_pad_,
               true);  // dK += dS^T Q
    add_query_grads(keys, dp_, b, h, i0, k0, nk, nq, kind);
  }

  // dQ_tile += ds K (ds [nk, kBq] transposed). As in the forward's P V, a key row that is not
  // finite on a Partial tile (garbage past a cache's length) is kept out of the product (0 * inf is
  // NaN) and added only to the rows that see it.
  void add_query_grads(const F32Rows& keys, const float* ds, Index b, Index h, Index i0, Index k0,
                       Index nk, Index nq, TileKind kind) {
    const auto product = [&](Index j0, Index j1) {
      gemm::gemm(nq, d_pad_, j1 - j0, {ds + j0 * kBq, 1, kBq}, keys.data + j0 * keys.ld, keys.ld,
                 dq_tile_, d_pad_, true);
    };
    if (kind == TileKind::Full || rows_finite(keys, 0, nk, d_pad_)) return product(0, nk);
    Index run = 0;
    for (Index jj = 0; jj < nk; ++jj) {
      if (rows_finite(keys, jj, jj + 1, d_pad_)) continue;
      if (jj > run) product(run, jj);
      add_to_visible_rows(spec_.mask, keys, b, h, i0, k0, jj, nq, ds, kBq, dq_tile_, d_pad_);
      run = jj + 1;
    }
    if (nk > run) product(run, nk);
  }

  // The inverse norms of keys k0, k0 + 1, ... of KV head hk (cosine logits).
  const float* key_norms(Index b, Index hk, Index k0) const {
    return key_scale_ + (b * p_.kv_heads + hk) * p_.kv_len + k0;
  }

  void finish_queries(Index b, Index h, Index q0, Index nq) {
    store_query_grads(spec_, p_, q_, dq_, b, h, q0, nq, dq_tile_, d_pad_, qrow_, inv_q_,
                      position_grad_);
  }

  void write_keys(Index b, Index hk) {
    store_key_grads(spec_, p_, k_, k_raw_, dk_, dv_, b, hk, acc_, key_scale_, row_, position_grad_);
  }

  const Spec& spec_;
  const Problem& p_;
  View<Q> q_;
  View<K> k_;
  View<V> v_;
  View<GO> d_o_;
  View<GQ> dq_;
  View<GK> dk_;
  View<GV> dv_;
  View<KR> k_raw_;
  double* position_grad_ = nullptr;  // [param_count] of the current item, or null
  const float* stat_;                // [B, Hq, Lq] the forward's row statistics (null: none)
  const float* delta_;               // [B, Hq, Lq] D_i = dO_i . O_i
  const float* key_scale_;           // [B, Hkv, Lk] inverse key norms (cosine logits only)
  Index d_pad_, dv_pad_;
  bool k_direct_, v_direct_;  // f32 rows used in place (K also as a GEMM's B: whole vectors)
  // Scratch of one thread, carved once:
  Scratch scratch_;
  float* own_k_;         // [Lk, d_pad]    dK of the item's KV head
  float* own_v_;         // [Lk, dv_pad]   dV
  KeyGrads acc_;         // where the key tiles add: own_k_ / own_v_, or a part's rows
  float* qt_;            // [D, kBq]       queries (turned, scaled), transposed
  float* qrow_;          // [kBq, d_pad]   the same in rows
  float* dot_;           // [Dv, kBq]      dO transposed
  float* dorow_;         // [kBq, dv_pad]  dO rows
  float* s_;             // [kBk, kBq]     logits, then weights P
  float* dp_;            // [kBk, kBq]     dP, then dS
  float* g_;             // [kBk, kBq]     the Score's derivative (a Score that has one)
  float* kp_;            // [kBk, d_pad]   f32 keys (unless used in place)
  float* vp_;            // [kBk, dv_pad]  f32 values (unless used in place)
  float* dq_tile_;       // [kBq, d_pad]   dQ of the query tile
  float* row_;           // [d_pad]        one unit key row (cosine logits)
  float* lane_grad_;     // [kBq]          per-row parameter gradient
  float* inv_q_;         // [kBq]          the rows' scale (1 / |q| for cosine logits)
  float* counts_;        // [kBq]          visible keys per row (kCountsKeys)
  float* lanes_;         // [kBq]          staging
  OwnedProducts owned_;  // a Position's own products (Tapa)
  // The query tile's normalizer states, one per kWidth rows:
  BackwardRows<Normalizer> rows_;
  std::vector<Index> bad_rows_;  // the query tile's dO rows that are not finite
  std::vector<float> bad_do_;    // their dO [bad rows, dv_pad]
};

}  // namespace attnkit::detail
