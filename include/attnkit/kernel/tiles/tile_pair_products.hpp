// TilePairProducts: the tile engine's two products (kernel/tiles/attention_tiles.hpp) on bf16
// pairs, for Products::Bf16 where gemm::pair_products_chosen() (vdpbf16ps,
// gemm/tile_gemm_bf16.hpp): it packs the operands, rounding them to bf16 as the portable form
// does -- the query columns in pairs of dims once per query tile, the weights in a row per
// query for each key tile -- and multiplies them with the call's K rows and V pairs, packed
// once for every query tile (kernel/tiles/pair_kv.hpp). A tile the call's pairs cannot serve (one
// that starts at an odd key; a run around a non-finite value row) packs its own K and V.
// Elsewhere it is off and holds nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnkit/core/tensor.hpp"
#include "attnkit/gemm/tile_gemm_bf16.hpp"
#include "attnkit/kernel/tiles/pair_kv.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/problem.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

/// Whether the tile kernel rounds its operands to bf16 in a call: Products::Bf16 where a
/// kernel makes that faster (gemm::bf16_products_here()).
inline bool rounds_operands(const Problem& p) {
  return p.products == Products::Bf16 && gemm::bf16_products_here();
}

class TilePairProducts {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ;
  static constexpr Index kBk = TileConfig::kBlockK;

  /// Whether they run for `bf16` (the engine rounds its operands): the pair products are
  /// chosen here and the SIMD width is theirs.
  static bool wanted(bool bf16) {
    return bf16 && gemm::pair_products_chosen() && simd::kWidth == gemm::kBf16Lanes;
  }

  /// Off unless wanted(bf16); head dim d, values dv_pad apart; kv: the call's K and V packed
  /// (pack_pair_kv), or null / empty (then each key tile is packed as it comes).
  TilePairProducts(bool bf16, Index d, Index dv_pad, const PairKv* kv = nullptr)
      : on_(wanted(bf16)),
        d_(d),
        dv_pad_(dv_pad),
        kv_(kv != nullptr && !kv->empty() ? kv : nullptr) {
    if (!on_) return;
    keys_.resize(static_cast<std::size_t>(kBk * even(d)));
    queries_.resize(static_cast<std::size_t>(even(d) / 2 * kBq));
    weights_.resize(static_cast<std::size_t>(kBq * even(kBk)));
    values_.resize(static_cast<std::size_t>(even(kBk) / 2 * dv_pad));
  }

  bool on() const { return on_; }
  /// On, with the call's K and V packed.
  bool packed() const { return on_ && kv_ != nullptr; }

  /// The query tile qt [d, kBq] (bf16 values), for logits().
  void pack_queries(const float* qt, Index lanes) {
    gemm::pack_bf16_pairs(qt, kBq, d_, lanes, queries_.data(), kBq);
  }

  /// s[nk, lanes] (rows kBq apart) = the nk key rows, rounded, . the packed queries.
  void logits(const F32Rows& keys, Index nk, Index lanes, float* s) {
    gemm::pack_bf16_rows(keys.data, keys.ld, 1, nk, d_, keys_.data(), even(d_));
    multiply(nk, lanes, d_, keys_.data(), even(d_), queries_.data(), kBq, s, kBq, false);
  }

  /// logits() on keys [k0, k0 + nk) of KV head (b, hk) from the packed call (packed()).
  void logits_packed(Index b, Index hk, Index k0, Index nk, Index lanes, float* s) {
    multiply(nk, lanes, d_, kv_->key_rows(b, hk, k0), kv_->d_even, queries_.data(), kBq, s, kBq,
             false);
  }

  /// weighted_sum() of the whole tile from the packed call's value pairs, when they can serve
  /// (packed()): the tile starts at an even key, and the key that shares its last pair, if
  /// any, has a finite value (its weight is 0); on a Partial tile (not `full`) every value is
  /// finite too (value_guard.hpp). False, with nothing done, when they cannot.
  bool weighted_sum_packed(const float* s, Index b, Index hk, Index k0, Index nk, Index nq,
                           bool full, float* acc) {
    const Index end = k0 + nk;
    if (k0 % 2 == 1 || (nk % 2 == 1 && end < kv_->len && !kv_->finite_rows(b, hk, end, end + 1)))
      return false;
    if (!full && !kv_->finite_rows(b, hk, k0, end)) return false;
    const Index ld = even(kBk);
    gemm::pack_bf16_rows(s, 1, kBq, nq, nk, weights_.data(), ld);
    multiply(nq, dv_pad_, nk, weights_.data(), ld, kv_->value_pairs(b, hk, k0), dv_pad_, acc,
             dv_pad_, true);
    return true;
  }

  /// acc[nq, dv_pad] += P[nq, j0:j1] * values[j0:j1], P read transposed from s [nk, kBq],
  /// both rounded.
  void weighted_sum(const float* s, const F32Rows& values, Index j0, Index j1, Index nq,
                    float* acc) {
    const Index n = j1 - j0, ld = even(kBk);
    gemm::pack_bf16_rows(s + j0 * kBq, 1, kBq, nq, n, weights_.data(), ld);
    gemm::pack_bf16_pairs(values.data + j0 * values.ld, values.ld, n, dv_pad_, values_.data(),
                          dv_pad_);
    multiply(nq, dv_pad_, n, weights_.data(), ld, values_.data(), dv_pad_, acc, dv_pad_, true);
  }

 private:
  static Index even(Index n) { return n + n % 2; }

  // gemm::gemm_bf16 where the build has it (on_ is false elsewhere).
  static void multiply(Index m, Index n, Index k, const std::uint16_t* a, Index lda,
                       const std::uint32_t* b, Index ldb, float* c, Index ldc, bool accumulate) {
#ifdef ATTNKIT_BF16_DOT
    gemm::gemm_bf16(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#else
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc,
        (void)accumulate;
#endif
  }

  bool on_;
  Index d_, dv_pad_;
  const PairKv* kv_;  // the call's K and V packed, or null
  // The packed operands (D', kBk' rounded up to even):
  std::vector<std::uint16_t> keys_;     // [kBk, D']           key rows
  std::vector<std::uint32_t> queries_;  // [D' / 2, kBq]       query columns in pairs of dims
  std::vector<std::uint16_t> weights_;  // [kBq, kBk']         weights, a row per query
  std::vector<std::uint32_t> values_;   // [kBk' / 2, dv_pad]  value rows in pairs of keys
};

}  // namespace attnkit::detail
