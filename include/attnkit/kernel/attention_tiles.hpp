// AttentionTiles: the per-thread engine of attention(). It owns one thread's scratch and
// computes whole query tiles: per (batch, head, query tile) it streams the key tiles the mask
// does not rule out, keeping the output accumulator and the normalizer state in scratch.
//
// Layout choice: the logit tile is computed transposed, S^T[keys, queries] = K * (Q^T),
// so K rows are read straight from the caller's view (no transpose copy per key tile),
// Q^T is packed once per query tile, and each SIMD lane of the softmax is one query.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "attnkit/detail/bf16_round.hpp"
#include "attnkit/detail/pack.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tile_config.hpp"
#include "attnkit/kernel/tile_mask.hpp"
#include "attnkit/kernel/tile_narrow.hpp"
#include "attnkit/kernel/tile_output.hpp"
#include "attnkit/kernel/tile_pair_products.hpp"
#include "attnkit/kernel/tile_queries.hpp"
#include "attnkit/kernel/value_guard.hpp"
#include "attnkit/mask/key_schedule.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/row_context.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/score_tile.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

// The per-call state of one thread: its scratch buffers and the call's constants.
template <class Spec, class Q, class K, class V, class O>
class AttentionTiles {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ;
  static constexpr Index kBk = TileConfig::kBlockK;
  using Normalizer = typename Spec::Normalizer;
  using State = typename Normalizer::State;
  static constexpr bool kCosine = cosine_logits<Normalizer>();
  static constexpr bool kCounts = counts_keys<Normalizer>();
  static constexpr bool kTurnsRows = transforms_rows<typename Spec::Position>();
  static constexpr bool kOwnsProduct = owns_product<typename Spec::Position>();

  /// key_scale: with cosine logits, the inverse norms of the key rows ([B, Hkv, Lk]);
  /// pair_kv: k and v packed for the bf16 pair products (when they run, else null or empty).
  AttentionTiles(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                 const View<V>& v, const View<O>& o, float* lse, const float* key_scale,
                 const PairKv* pair_kv = nullptr)
      : spec_(spec),
        p_(p),
        q_(q),
        k_(k),
        v_(v),
        o_(o),
        lse_(lse),
        key_scale_(key_scale),
        dv_pad_(simd::round_up(p.value_dim)),
        bf16_(rounds_operands(p)),
        k_direct_(is_f32<K>() && !bf16_),
        v_direct_(is_f32<V>() && dv_pad_ == p.value_dim && !bf16_),
        scratch_(Scratch::size_for(
            p.head_dim * kBq, k_direct_ ? 0 : kBk * p.head_dim, v_direct_ ? 0 : kBk * dv_pad_,
            kBk * kBq, kBq * dv_pad_, kBq, kCounts ? kBq : 0, kTurnsRows ? p.head_dim : 0,
            kOwnsProduct ? kBk * kBq : 0, kOwnsProduct ? kBq + kBk : 0, kNarrow * p.head_dim)),
        qt_(scratch_.carve(p.head_dim * kBq)),
        kp_(k_direct_ ? nullptr : scratch_.carve(kBk * p.head_dim)),
        vp_(v_direct_ ? nullptr : scratch_.carve(kBk * dv_pad_)),
        s_(scratch_.carve(kBk * kBq)),
        acc_(scratch_.carve(kBq * dv_pad_)),
        factor_(scratch_.carve(kBq)),
        counts_(kCounts ? scratch_.carve(kBq) : nullptr),
        row_(kTurnsRows ? scratch_.carve(p.head_dim) : nullptr),
        s2_(kOwnsProduct ? scratch_.carve(kBk * kBq) : nullptr),
        work_(kOwnsProduct ? scratch_.carve(kBq + kBk) : nullptr),
        qr_(scratch_.carve(kNarrow * p.head_dim)),
        states_(kBq / simd::kWidth),
        pairs_(bf16_, p.head_dim, dv_pad_, pair_kv) {}

  /// Computes output rows [q0, q0 + nq) of query head h in batch b.
  void run(Index b, Index h, Index q0, Index nq) {
    compute(b, h, q0, nq, Range{0, p_.kv_len});
    write_output(b, h, q0, nq, simd::round_up(nq));
  }

  /// The partial result of rows [q0, q0 + nq) over the keys in `keys` only (split-KV):
  /// out[r * ld + c] for c < Dv, and the row statistic in stat[r] (when stat is not null).
  void run_part(Index b, Index h, Index q0, Index nq, Range keys, float* out, Index ld,
                float* stat) {
    compute(b, h, q0, nq, keys);
    const Index lanes = simd::round_up(nq);
    finalize_rows(b, h, q0, nq, lanes, keys);
    for (Index r = 0; r < nq; ++r)
      for (Index c = 0; c < p_.value_dim; ++c) out[r * ld + c] = acc_[r * dv_pad_ + c] * factor_[r];
    if (stat != nullptr) store_row_stats(spec_.normalizer, states_.data(), stat, nq, lanes);
  }

  /// Queries per tile up to which the products run row by row (a dot product per key and
  /// query, vectorized over the head dimension) instead of as tile GEMMs: few queries would
  /// fill one lane of each GEMM vector.
  static constexpr Index kNarrow = 4;

 private:
  // acc_ and the normalizer states of rows [q0, q0 + nq) over the keys in `keys`.
  void compute(Index b, Index h, Index q0, Index nq, Range keys) {
    const Index hk = p_.kv_head(h);
    const Index lanes = simd::round_up(nq);  // queries padded to whole vectors
    const Range q_pos{q0 + p_.q_offset, q0 + nq + p_.q_offset};

    // qt_ [D, kBq]: the query tile, turned, scaled and (bf16 products) rounded.
    pack_query_tile(spec_, p_, q_, b, h, q0, nq, lanes, bf16_, qt_, kBq, row_, factor_);
    narrow_ = nq <= kNarrow && !kOwnsProduct;
    nq_ = nq;
    if (narrow_) narrow::pack_query_rows(qt_, kBq, nq, p_.head_dim, qr_);  // qr_ [nq, D]
    if (pairs_.on() && !narrow_) pairs_.pack_queries(qt_, lanes);
    begin_rows(b, h, q0, nq, q_pos.begin);
    std::fill(acc_, acc_ + nq * dv_pad_, 0.f);  // acc_ [kBq, dv_pad]

    // Only the key tiles the mask lets some query see (key_schedule.hpp): with Causal the
    // diagonal tile ends at the last visible key, `Sinks | window` visits two short ranges.
    const auto for_each_logit_tile = [&](auto&& use) {
      for_each_key_tile(
          spec_.mask, b, h, q_pos, p_.kv_len, kBk,
          [&](Range kv, TileKind kind) {
            const Index k0 = kv.begin, nk = kv.end - kv.begin;
            scores(b, hk, q_pos.begin, k0, nk, lanes);  // s_ [nk, kBq]
            apply_score_mods(ScoreTile{b, h, q_pos.begin, k0}, nk, lanes);
            if (kind == TileKind::Partial)
              mask_partial_tile(spec_.mask, s_, kBq, b, h, q_pos.begin, k0, nk, nq, lanes);
            use(k0, nk, kind);
          },
          keys);
    };
    // Passes before the last keep row statistics only (LSSAR's row sums).
    if constexpr (passes<Normalizer>() > 1) {
      for (int pass = 1; pass < passes<Normalizer>(); ++pass) {
        for_each_logit_tile([&](Index, Index nk, TileKind) { observe(nk, lanes); });
        for (Index c = 0; c < lanes; c += simd::kWidth)
          spec_.normalizer.end_pass(states_[static_cast<std::size_t>(c / simd::kWidth)]);
      }
    }
    do {
      for_each_logit_tile([&](Index k0, Index nk, TileKind kind) {
        absorb(nk, nq, lanes);  // weights (their row sums in f32), rescale
        if (bf16_ && !pairs_.on()) round_rows_to_bf16(s_, nk, lanes, kBq);
        accumulate_values(b, h, hk, q_pos.begin, k0, nk, nq, kind);  // acc_ += P V
      });
    } while (another_pass_needed(lanes));
  }

  // The normalizer states of rows [q0, q0 + nq), one per lane block, with their context:
  // the flat index of their row statistic and, if the normalizer asks, their key counts.
  void begin_rows(Index b, Index h, Index q0, Index nq, Index i0) {
    if constexpr (kCounts) {
      for (Index r = 0; r < nq; ++r)
        counts_[r] = static_cast<float>(visible_key_count(spec_.mask, b, h, i0 + r, p_.kv_len));
    }
    const Index row0 = (b * p_.q_heads + h) * p_.q_len + q0;
    for (Index c = 0; c < nq; c += simd::kWidth)
      states_[static_cast<std::size_t>(c / simd::kWidth)] =
          begin_state(spec_.normalizer, RowContext{b, h, p_.kv_len, p_.head_dim, row0 + c, nq - c,
                                                   kCounts ? counts_ + c : nullptr});
  }

  // s_[nk, lanes] = K[k0:k0+nk] * qt_ (scale already in qt_). A Position that owns the
  // product (TAPA) gets the products of the two parts of the head dims, s_ and s2_, and
  // joins them.
  void key_products(Index b, Index hk, Index i0, Index k0, Index nk, Index lanes) {
    const F32Rows keys = f32_rows(k_, k_direct_, b, hk, k0, nk, kp_, p_.head_dim);
    if (bf16_ && !pairs_.on() && !is_bf16<K>())
      round_rows_to_bf16(kp_, nk, p_.head_dim, p_.head_dim);
    if constexpr (kOwnsProduct) {
      const Index d = p_.head_dim, a = spec_.position.amplitude_dims(d);
      gemm::gemm(nk, lanes, a, {keys.data, keys.ld, 1}, qt_, kBq, s_, kBq, false);
      if (a < d)
        gemm::gemm(nk, lanes, d - a, {keys.data + a, keys.ld, 1}, qt_ + a * kBq, kBq, s2_, kBq,
                   false);
      spec_.position.combine(s_, s2_, nk, lanes, kBq, i0, k0, d, work_);
      return;
    }
    (void)i0;
    if (narrow_)
      narrow::dot_rows(keys, nk, nq_, lanes, qr_, p_.head_dim, s_, kBq);
    else if (pairs_.on())
      pairs_.logits(keys, nk, lanes, s_);
    else
      gemm::gemm(nk, lanes, p_.head_dim, {keys.data, keys.ld, 1}, qt_, kBq, s_, kBq, false);
  }

  // s_ as key_products() forms it (or from the call's packed K), then, with cosine logits,
  // each key row divided by its norm.
  void scores(Index b, Index hk, Index i0, Index k0, Index nk, Index lanes) {
    if (!kOwnsProduct && !narrow_ && pairs_.packed())
      pairs_.logits_packed(b, hk, k0, nk, lanes, s_);  // the call's K, packed once
    else
      key_products(b, hk, i0, k0, nk, lanes);
    if constexpr (kCosine) {
      const float* inv = key_scale_ + (b * p_.kv_heads + hk) * p_.kv_len + k0;
      for (Index jj = 0; jj < nk; ++jj) {
        const simd::Vec f(inv[jj]);
        float* row = s_ + jj * kBq;
        for (Index c = 0; c < lanes; c += simd::kWidth)
          simd::store(row + c, simd::load(row + c) * f);
      }
    }
  }

  // A statistics-only pass over one tile of logits.
  void observe(Index nk, Index lanes) {
    for (Index c = 0; c < lanes; c += simd::kWidth)
      spec_.normalizer.observe(states_[static_cast<std::size_t>(c / simd::kWidth)], s_ + c, nk,
                               kBq);
  }

  // After the last pass: whether some row asks for it again (every state is asked).
  bool another_pass_needed(Index lanes) {
    bool again = false;
    for (Index c = 0; c < lanes; c += simd::kWidth)
      again = another_pass(spec_.normalizer, states_[static_cast<std::size_t>(c / simd::kWidth)]) ||
              again;
    return again;
  }

  void apply_score_mods(const ScoreTile& where, Index nk, Index lanes) {
    using Score = typename Spec::Score;
    if constexpr (has_apply_tile<Score>::value) {
      spec_.score.apply_tile(s_, nk, lanes, kBq, where);
    } else {
      static_assert(!has_modify<Score>::value,
                    "attention(): a Score policy with modify() also needs apply_tile()");
    }
  }

  // Logits -> weights, lane block by lane block; rescales the accumulator rows unless the
  // normalizer keeps no running maximum (sigmoid, ReLU^a: kRescales = false).
  void absorb(Index nk, Index nq, Index lanes) {
    for (Index c = 0; c < lanes; c += simd::kWidth) {
      const simd::Vec alpha = spec_.normalizer.absorb(
          states_[static_cast<std::size_t>(c / simd::kWidth)], s_ + c, nk, kBq);
      simd::store(factor_ + c, alpha);
    }
    if constexpr (!rescales<Normalizer>()) return;
    for (Index r = 0; r < nq; ++r) {
      const simd::Vec f(factor_[r]);
      float* row = acc_ + r * dv_pad_;
      for (Index c = 0; c < dv_pad_; c += simd::kWidth)
        simd::store(row + c, simd::load(row + c) * f);
    }
  }

  // acc_[nq, dv] += P[nq, nk] * V[k0:k0+nk], with P read transposed from s_.
  // A masked pair weighs 0, but 0 * inf and 0 * NaN are NaN: on a Partial tile a value row
  // that is not finite (garbage past a KV cache's length, a poisoned future key) would leak
  // into rows that cannot see it. One pass finds such rows (1/kBq of the product's work,
  // Partial tiles only); the product then skips them and adds each to the rows that see it.
  void accumulate_values(Index b, Index h, Index hk, Index i0, Index k0, Index nk, Index nq,
                         TileKind kind) {
    if (!narrow_ && pairs_.packed() &&
        pairs_.weighted_sum_packed(s_, b, hk, k0, nk, nq, kind == TileKind::Full, acc_))
      return;  // the call's V, packed once
    const F32Rows values = f32_rows(v_, v_direct_, b, hk, k0, nk, vp_, dv_pad_);
    if (bf16_ && !pairs_.on() && !is_bf16<V>()) round_rows_to_bf16(vp_, nk, p_.value_dim, dv_pad_);
    if (kind == TileKind::Full || rows_finite(values, 0, nk, dv_pad_)) {
      weighted_sum(values, 0, nk, nq);
      return;
    }
    Index run = 0;  // first key of the current run of finite value rows
    for (Index jj = 0; jj < nk; ++jj) {
      if (rows_finite(values, jj, jj + 1, dv_pad_)) continue;
      weighted_sum(values, run, jj, nq);
      add_to_visible_rows(spec_.mask, values, b, h, i0, k0, jj, nq, s_, kBq, acc_, dv_pad_);
      run = jj + 1;
    }
    weighted_sum(values, run, nk, nq);
  }

  // acc_[nq, dv] += P[nq, j0:j1] * values[j0:j1]; row by row when narrow.
  void weighted_sum(const F32Rows& values, Index j0, Index j1, Index nq) {
    if (pairs_.on() && !narrow_) return pairs_.weighted_sum(s_, values, j0, j1, nq, acc_);
    if (!narrow_) {
      gemm::gemm(nq, dv_pad_, j1 - j0, {s_ + j0 * kBq, 1, kBq}, values.data + j0 * values.ld,
                 values.ld, acc_, dv_pad_, true);
      return;
    }
    narrow::weighted_sum(s_, kBq, values, j0, j1, nq, p_.value_dim, acc_, dv_pad_);
  }

  // factor_ = each row's finalize factor. A row with an LSE whose factor is 0 ("saw no key")
  // but which the mask lets see keys in `keys` had all their logits at -inf: products that
  // overflow f32 (q = 1e20, k = -1e20). f32 cannot weigh them: its output becomes NaN, its
  // LSE stays -inf (a merge weighs it 0 beside a part with a finite LSE, as f64 would). Only
  // such rows ask the mask again: nothing per key.
  void finalize_rows(Index b, Index h, Index q0, Index nq, Index lanes, Range keys) {
    finalize_factors(spec_.normalizer, states_.data(), lanes, factor_);
    if constexpr (row_stat_kind<Normalizer>() == RowStat::LogSumExp)
      for (Index r = 0; r < nq; ++r)
        if (factor_[r] == 0.f &&
            visible_key_count(spec_.mask, b, h, q0 + r + p_.q_offset, p_.kv_len, keys) > 0)
          factor_[r] = std::numeric_limits<float>::quiet_NaN();
  }

  void write_output(Index b, Index h, Index q0, Index nq, Index lanes) {
    finalize_rows(b, h, q0, nq, lanes, Range{0, p_.kv_len});
    if (lse_ != nullptr)
      store_row_stats(spec_.normalizer, states_.data(), lse_ + (b * p_.q_heads + h) * p_.q_len + q0,
                      nq, lanes);
    write_rows(acc_, dv_pad_, factor_, o_, b, h, q0, nq, p_.value_dim);
  }

  const Spec& spec_;
  const Problem& p_;
  View<Q> q_;
  View<K> k_;
  View<V> v_;
  View<O> o_;
  float* lse_;
  const float* key_scale_;  // [B, Hkv, Lk] inverse key norms (cosine logits only)
  Index dv_pad_;
  bool bf16_;                 // Products::Bf16: Q, K, V and P rounded to bf16 (f32 products)
  bool k_direct_, v_direct_;  // f32 K/V rows feed the GEMMs in place, no packing
  // Scratch of one thread, carved once:
  Scratch scratch_;
  float* qt_;                  // [D, kBq]       scaled queries, transposed
  float* kp_;                  // [kBk, D]       f32 keys (only for non-f32 storage)
  float* vp_;                  // [kBk, dv_pad]  f32 values, padded (only when not used in place)
  float* s_;                   // [kBk, kBq]     logits, then weights
  float* acc_;                 // [kBq, dv_pad]  output accumulator
  float* factor_;              // [kBq]          per-query scale, rescale, finalize factors
  float* counts_;              // [kBq]          visible keys per query (kCountsKeys only)
  float* row_;                 // [D]            one query row being transformed (Position)
  float* s2_;                  // [kBk, kBq]     second product (a Position that owns it)
  float* work_;                // [kBq + kBk]    its per-tile table
  float* qr_;                  // [kNarrow, D]   the packed queries in rows (narrow tiles)
  bool narrow_ = false;        // this tile's products run row by row (nq <= kNarrow)
  Index nq_ = 0;               // rows of the current tile
  std::vector<State> states_;  // [kBq / kWidth] normalizer state, one lane per query
  TilePairProducts pairs_;     // bf16 mode on vdpbf16ps: packs (and rounds) K, V and P itself
};

}  // namespace detail
}  // namespace attnkit
