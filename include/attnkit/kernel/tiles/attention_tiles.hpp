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

#include "attnkit/detail/traits.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tiles/tile_band.hpp"
#include "attnkit/kernel/tiles/tile_buffers.hpp"
#include "attnkit/kernel/tiles/tile_columns.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/kernel/tiles/tile_mask.hpp"
#include "attnkit/kernel/tiles/tile_narrow.hpp"
#include "attnkit/kernel/tiles/tile_output.hpp"
#include "attnkit/kernel/tiles/tile_pair_products.hpp"
#include "attnkit/kernel/tiles/tile_queries.hpp"
#include "attnkit/kernel/tiles/tile_rows.hpp"
#include "attnkit/kernel/tiles/value_guard.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/key_columns.hpp"
#include "attnkit/mask/key_schedule.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/mask/visible_keys.hpp"
#include "attnkit/normalizer/faces.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/score/faces.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/bf16_round.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit {
namespace detail {

// The per-call state of one thread: its scratch buffers and the call's constants.
template <class Spec, class Q, class K, class V, class O>
class AttentionTiles {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ;
  static constexpr Index kBk = TileConfig::kBlockK;
  using Normalizer = typename Spec::Normalizer;
  static constexpr bool kCosine = cosine_logits<Normalizer>();
  static constexpr bool kCounts = counts_keys<Normalizer>();
  static constexpr bool kTurnsRows = transforms_rows<typename Spec::Position>();
  static constexpr bool kOwnsProduct = owns_product<typename Spec::Position>();
  using Mask = typename Spec::Mask;
  // Masks with gathered columns (mask/key_columns.hpp) tile their range part, then the columns,
  // unless the Position owns the product (its tables are per key tile).
  static constexpr bool kColumns = has_columns<Mask>::value && !kOwnsProduct;

  /// key_scale: with cosine logits, the inverse norms of the key rows ([B, Hkv, Lk]);
  /// pair_kv: k and v packed for the bf16 pair products (when they run, else null or empty);
  /// gather: a mask with gathered columns uses them (else its whole mask is tiled).
  AttentionTiles(const Spec& spec, const Problem& p, const View<Q>& q, const View<K>& k,
                 const View<V>& v, const View<O>& o, float* lse, const float* key_scale,
                 const PairKv* pair_kv = nullptr, bool gather = kColumns)
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
        buf_(p.head_dim, dv_pad_,
             {!k_direct_, !v_direct_, kCounts, kTurnsRows, kOwnsProduct, kColumns, kQueryRows}),
        rows_(kBq),
        pairs_(bf16_, p.head_dim, dv_pad_, pair_kv),
        gather_(kColumns && gather),
        parts_(spec.mask) {}

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
    rows_.finalize(spec_.normalizer, spec_.mask, p_, b, h, q0, nq, lanes, keys, buf_.factor);
    for (Index r = 0; r < nq; ++r)
      for (Index c = 0; c < p_.value_dim; ++c)
        out[r * ld + c] = buf_.acc[r * dv_pad_ + c] * buf_.factor[r];
    if (stat != nullptr) rows_.store(spec_.normalizer, stat, nq, lanes);
  }

  /// Queries per tile up to which the products run row by row (dot products vectorized over
  /// the head dimension), not as tile GEMMs, whose vectors few queries would barely fill.
  static constexpr Index kNarrow = 4;
  // Query rows packed in row form: the narrow tiles', or every row for gathered columns.
  static constexpr Index kQueryRows = kColumns ? kBq : kNarrow;

 private:
  // buf_.acc and the normalizer states of rows [q0, q0 + nq) over the keys in `keys`: key tiles
  // over the mask (or its range part, and then its gathered columns).
  void compute(Index b, Index h, Index q0, Index nq, Range keys) {
    if constexpr (kColumns)
      if (gather_) return compute_over(parts_.range, b, h, q0, nq, keys);
    compute_over(spec_.mask, b, h, q0, nq, keys);
  }

  // One tile of logits in buf_.s: keys [k0, k0 + nk) of `kind`, or (t0 >= 0) columns' rows.
  struct LogitTile {
    Index k0, nk;
    TileKind kind;
    Index t0 = -1;
    bool hulls = false;  // lane_keys_ holds each lane block's keys (masked by runs)
  };

  template <class ScheduleMask>
  void compute_over(const ScheduleMask& mask, Index b, Index h, Index q0, Index nq, Range keys) {
    const Index hk = p_.kv_head(h);
    const Index lanes = simd::round_up(nq);  // queries padded to whole vectors
    const Range q_pos{q0 + p_.q_offset, q0 + nq + p_.q_offset};

    narrow_ = nq <= kNarrow && !kOwnsProduct;
    nq_ = nq;
    Index column_rows = 0;  // rows of the gathered columns' tile
    if constexpr (kColumns)
      if (gather_)
        column_rows = parts_.columns.gather(spec_.mask, b, h, q_pos.begin, nq, keys.begin,
                                            keys.end < 0 ? p_.kv_len : keys.end);
    rows_.begin(spec_.normalizer, spec_.mask, p_, b, h, q0, nq, q_pos.begin, buf_.counts);
    std::fill(buf_.acc, buf_.acc + nq * dv_pad_, 0.f);  // buf_.acc [kBq, dv_pad]
    // A split-KV chunk the mask leaves empty (most of them, for a sparse mask) ends here.
    if (column_rows == 0 && (keys.begin > 0 || (keys.end >= 0 && keys.end < p_.kv_len)) &&
        !any_key_tile(mask, b, h, q_pos, p_.kv_len, kBk, keys))
      return;
    // buf_.qt [D, kBq]: the query tile, turned, scaled and (bf16 products) rounded; also in rows,
    // buf_.qr [nq, D], for the row-by-row products.
    pack_query_tile(spec_, p_, q_, b, h, q0, nq, lanes, bf16_, buf_.qt, kBq, buf_.row, buf_.factor,
                    narrow_ || column_rows > 0 ? buf_.qr : nullptr);
    if (pairs_.on() && !narrow_) pairs_.pack_queries(buf_.qt, lanes);

    // Only the key tiles the mask lets some query see (key_schedule.hpp): with Causal the
    // diagonal tile ends at the last visible key, `Sinks | window` visits two short ranges.
    const auto for_each_logit_tile = [&](auto&& use) {
      for_each_key_tile(
          mask, b, h, q_pos, p_.kv_len, kBk,
          [&](Range kv, TileKind kind) {
            const Index k0 = kv.begin, nk = kv.end - kv.begin;
            band_on_ = kind == TileKind::Partial && !narrow_ && !kOwnsProduct && !pairs_.on() &&
                       band_.form(mask, b, h, q_pos.begin, k0, nk, nq, lanes);
            scores(b, hk, q_pos.begin, k0, nk, lanes);  // buf_.s [nk, kBq]
            apply_score_mods(ScoreTile{b, h, q_pos.begin, k0}, nk, lanes);
            if (kind == TileKind::Partial)
              mask_partial_tile(mask, buf_.s, kBq, b, h, q_pos.begin, k0, nk, nq, lanes,
                                seen_.data(), lane_keys_);
            use(LogitTile{k0, nk, kind, -1,
                          kind == TileKind::Partial && has_runs<ScheduleMask>::value});
          },
          keys);
      for (Index t0 = 0; t0 < column_rows; t0 += kBk) {  // buf_.s [nt, kBq]
        const Index nt = std::min(kBk, column_rows - t0);
        column_logits(b, h, hk, q_pos.begin, t0, nt, nq, lanes);
        use(LogitTile{0, nt, TileKind::Partial, t0});
      }
    };
    // Passes before the last keep row statistics only (LSSAR's row sums).
    if constexpr (passes<Normalizer>() > 1) {
      for (int pass = 1; pass < passes<Normalizer>(); ++pass) {
        for_each_logit_tile([&](const LogitTile& tile) {
          rows_.observe(spec_.normalizer, buf_.s, tile.nk, lanes, kBq);
        });
        rows_.end_pass(spec_.normalizer, lanes);
      }
    }
    do {
      for_each_logit_tile([&](const LogitTile& tile) {
        // weights (their row sums in f32), rescale
        rows_.absorb(spec_.normalizer, buf_.s, tile.nk, nq, lanes, kBq, buf_.factor, buf_.acc,
                     dv_pad_, tile.hulls ? lane_keys_ : nullptr);
        // P rounded here unless the call's packed pair products round it as they pack it
        // (split-KV chunks have no packed call: their P.V runs f32 FMAs on rounded P and V).
        if (bf16_ && (!pairs_.packed() || tile.t0 >= 0))
          round_rows_to_bf16(buf_.s, tile.nk, lanes, kBq);
        if (tile.t0 < 0)  // buf_.acc += P V
          accumulate_values(mask, b, h, hk, q_pos.begin, tile.k0, tile.nk, nq, tile.kind);
        else
          column_values(b, hk, tile.t0, tile.nk, nq);
      });
    } while (rows_.another(spec_.normalizer, lanes));
  }

  // buf_.s[nk, lanes] = K[k0:k0+nk] * buf_.qt (scale already in buf_.qt). A Position owning the
  // product (TAPA) joins the products of the two parts of the head dims, buf_.s and buf_.s2.
  void key_products(Index b, Index hk, Index i0, Index k0, Index nk, Index lanes) {
    const F32Rows keys = f32_rows(k_, k_direct_, b, hk, k0, nk, buf_.kp, p_.head_dim);
    if (bf16_ && !pairs_.on() && !is_bf16<K>())
      round_rows_to_bf16(buf_.kp, nk, p_.head_dim, p_.head_dim);
    if constexpr (kOwnsProduct) {
      const Index d = p_.head_dim, a = spec_.position.amplitude_dims(d);
      gemm::gemm(nk, lanes, a, {keys.data, keys.ld, 1}, buf_.qt, kBq, buf_.s, kBq, false);
      if (a < d)
        gemm::gemm(nk, lanes, d - a, {keys.data + a, keys.ld, 1}, buf_.qt + a * kBq, kBq, buf_.s2,
                   kBq, false);
      spec_.position.combine(buf_.s, buf_.s2, nk, lanes, kBq, i0, k0, d, buf_.work);
      return;
    }
    (void)i0;
    if (narrow_)
      narrow::dot_rows(keys, nk, nq_, lanes, buf_.qr, p_.head_dim, buf_.s, kBq);
    else if (band_on_)
      band_.logits(keys, nk, lanes, buf_.qt, kBq, p_.head_dim, buf_.s, kBq);
    else if (pairs_.on())
      pairs_.logits(keys, nk, lanes, buf_.s);
    else
      gemm::gemm(nk, lanes, p_.head_dim, {keys.data, keys.ld, 1}, buf_.qt, kBq, buf_.s, kBq, false);
  }

  // buf_.s as key_products() forms it (or from the call's packed K), then, with cosine logits,
  // each key row divided by its norm.
  void scores(Index b, Index hk, Index i0, Index k0, Index nk, Index lanes) {
    if (!kOwnsProduct && !narrow_ && pairs_.packed())
      pairs_.logits_packed(b, hk, k0, nk, lanes, buf_.s);  // the call's K, packed once
    else
      key_products(b, hk, i0, k0, nk, lanes);
    if constexpr (kCosine) {
      const float* inv = key_scale_ + (b * p_.kv_heads + hk) * p_.kv_len + k0;
      for (Index jj = 0; jj < nk; ++jj) {
        const simd::Vec f(inv[jj]);
        float* row = buf_.s + jj * kBq;
        for (Index c = 0; c < lanes; c += simd::kWidth)
          simd::store(row + c, simd::load(row + c) * f);
      }
    }
  }

  // s [nt, kBq]: rows [t0, t0 + nt) of the gathered columns' logits (tile_columns.hpp).
  void column_logits(Index b, Index h, Index hk, Index i0, Index t0, Index nt, Index nq,
                     Index lanes) {
    if constexpr (kColumns)
      parts_.columns.logits(k_, k_direct_, bf16_, b, hk, t0, nt, nq, lanes, buf_.qr, buf_.qt, kBq,
                            p_.head_dim, buf_.col_rows, buf_.s, kBq, spec_.score,
                            kCosine ? key_scale_ + (b * p_.kv_heads + hk) * p_.kv_len : nullptr, h,
                            i0);
  }

  // buf_.acc += the gathered columns' weights (rows [t0, t0 + nt) of buf_.s) times their rows.
  void column_values(Index b, Index hk, Index t0, Index nt, Index nq) {
    if constexpr (kColumns)
      parts_.columns.weighted_sum(v_, bf16_, b, hk, t0, nt, nq, buf_.s, kBq, buf_.col_rows,
                                  buf_.acc, p_.value_dim, dv_pad_);
  }

  void apply_score_mods(const ScoreTile& where, Index nk, Index lanes) {
    using Score = typename Spec::Score;
    if constexpr (has_apply_tile<Score>::value) {
      spec_.score.apply_tile(buf_.s, nk, lanes, kBq, where);
    } else {
      static_assert(!has_modify<Score>::value,
                    "attention(): a Score policy with modify() also needs apply_tile()");
    }
  }

  // buf_.acc[nq, dv] += P[nq, nk] * V[k0:k0+nk], with P read transposed from buf_.s.
  // A masked pair weighs 0, but 0 * inf and 0 * NaN are NaN: on a Partial tile a value row
  // that is not finite (garbage past a KV cache's length, a poisoned future key) would leak
  // into rows that cannot see it. One pass finds such rows (1/kBq of the product's work,
  // Partial tiles only); the product then skips them and adds each to the rows that see it.
  template <class ScheduleMask>
  void accumulate_values(const ScheduleMask& mask, Index b, Index h, Index hk, Index i0, Index k0,
                         Index nk, Index nq, TileKind kind) {
    if (!narrow_ && pairs_.packed() &&
        pairs_.weighted_sum_packed(buf_.s, b, hk, k0, nk, nq, kind == TileKind::Full, buf_.acc))
      return;  // the call's V, packed once
    const F32Rows values = f32_rows(v_, v_direct_, b, hk, k0, nk, buf_.vp, dv_pad_);
    // bf16 products: the guard below must see the values as the products will (a finite f32
    // past bf16's largest rounds to inf), so a Partial tile's rows are rounded here also when
    // the pair products would round them in their own packing (rounding twice is rounding once).
    if (bf16_ && !is_bf16<V>() && (!pairs_.packed() || kind != TileKind::Full))
      round_rows_to_bf16(buf_.vp, nk, p_.value_dim, dv_pad_);
    if (kind == TileKind::Full ||
        rows_finite_unseen<ScheduleMask>(values, nk, seen_.data(), dv_pad_)) {
      weighted_sum(values, 0, nk, nq);
      return;
    }
    Index run = 0;  // first key of the current run of finite value rows
    for (Index jj = 0; jj < nk; ++jj) {
      if (rows_finite(values, jj, jj + 1, dv_pad_)) continue;
      weighted_sum(values, run, jj, nq);
      add_to_visible_rows(mask, values, b, h, i0, k0, jj, nq, buf_.s, kBq, buf_.acc, dv_pad_);
      run = jj + 1;
    }
    weighted_sum(values, run, nk, nq);
  }

  // buf_.acc[nq, dv] += P[nq, j0:j1] * values[j0:j1]; row by row when narrow.
  void weighted_sum(const F32Rows& values, Index j0, Index j1, Index nq) {
    if (pairs_.on() && !narrow_) return pairs_.weighted_sum(buf_.s, values, j0, j1, nq, buf_.acc);
    if (band_on_) return band_.weighted_sum(buf_.s, kBq, values, j0, j1, nq, buf_.acc, dv_pad_);
    if (!narrow_) {
      gemm::gemm(nq, dv_pad_, j1 - j0, {buf_.s + j0 * kBq, 1, kBq}, values.data + j0 * values.ld,
                 values.ld, buf_.acc, dv_pad_, true);
      return;
    }
    narrow::weighted_sum(buf_.s, kBq, values, j0, j1, nq, p_.value_dim, buf_.acc, dv_pad_);
  }

  void write_output(Index b, Index h, Index q0, Index nq, Index lanes) {
    rows_.finalize(spec_.normalizer, spec_.mask, p_, b, h, q0, nq, lanes, Range{0, p_.kv_len},
                   buf_.factor);
    if (lse_ != nullptr)
      rows_.store(spec_.normalizer, lse_ + (b * p_.q_heads + h) * p_.q_len + q0, nq, lanes);
    write_rows(buf_.acc, dv_pad_, buf_.factor, o_, b, h, q0, nq, p_.value_dim);
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
  TileBuffers buf_;           // this thread's scratch, carved once
  std::vector<char> seen_ = std::vector<char>(std::size_t{kBk});  // rows all queries see
  Range lane_keys_[std::size_t{kBq / simd::kWidth}] = {};  // per lane block, the keys it sees
  bool narrow_ = false;              // this tile's products run row by row (nq <= kNarrow)
  Index nq_ = 0;                     // rows of the current tile
  TileRows<Normalizer> rows_;        // the rows' normalizer states, one per kWidth queries
  TilePairProducts pairs_;           // bf16 mode on vdpbf16ps: packs (and rounds) K, V and P itself
  bool gather_;                      // the mask's range part is tiled and its columns gathered
  TileBand band_;                    // a Partial tile's key hulls per group of queries
  bool band_on_ = false;             // the current tile's products run over them
  MaskParts<Mask, kColumns> parts_;  // that range part, and the query tile's columns
};

}  // namespace detail
}  // namespace attnkit
