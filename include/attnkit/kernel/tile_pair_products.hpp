// TilePairProducts: the tile engine's two products (kernel/attention_tiles.hpp) on bf16
// pairs, for Products::Bf16 where gemm::pair_products_chosen() (vdpbf16ps,
// gemm/tile_gemm_bf16.hpp): it packs the operands, rounding them to bf16 as the portable form
// does -- the query columns in pairs of dims once per query tile, the key rows, the weights
// in a row per query and the value rows in pairs of keys once per key tile -- and multiplies.
// Elsewhere it is off and holds nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnkit/detail/pack.hpp"
#include "attnkit/gemm/tile_gemm_bf16.hpp"
#include "attnkit/kernel/tile_config.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/tensor.hpp"

namespace attnkit::detail {

class TilePairProducts {
 public:
  static constexpr Index kBq = TileConfig::kBlockQ;
  static constexpr Index kBk = TileConfig::kBlockK;

  /// Off unless `bf16` (the engine rounds its operands) and the pair products are chosen
  /// here; head dim d, values dv_pad apart.
  TilePairProducts(bool bf16, Index d, Index dv_pad)
      : on_(bf16 && gemm::pair_products_chosen() && simd::kWidth == gemm::kBf16Lanes),
        d_(d),
        dv_pad_(dv_pad) {
    if (!on_) return;
    keys_.resize(static_cast<std::size_t>(kBk * even(d)));
    queries_.resize(static_cast<std::size_t>(even(d) / 2 * kBq));
    weights_.resize(static_cast<std::size_t>(kBq * even(kBk)));
    values_.resize(static_cast<std::size_t>(even(kBk) / 2 * dv_pad));
  }

  bool on() const { return on_; }

  /// The query tile qt [d, kBq] (bf16 values), for logits().
  void pack_queries(const float* qt, Index lanes) {
    gemm::pack_bf16_pairs(qt, kBq, d_, lanes, queries_.data(), kBq);
  }

  /// s[nk, lanes] (rows kBq apart) = the nk key rows, rounded, . the packed queries.
  void logits(const F32Rows& keys, Index nk, Index lanes, float* s) {
    gemm::pack_bf16_rows(keys.data, keys.ld, 1, nk, d_, keys_.data(), even(d_));
    multiply(nk, lanes, d_, keys_.data(), even(d_), queries_.data(), kBq, s, kBq, false);
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
  // The packed operands (D', kBk' rounded up to even):
  std::vector<std::uint16_t> keys_;     // [kBk, D']           key rows
  std::vector<std::uint32_t> queries_;  // [D' / 2, kBq]       query columns in pairs of dims
  std::vector<std::uint16_t> weights_;  // [kBq, kBk']         weights, a row per query
  std::vector<std::uint32_t> values_;   // [kBk' / 2, dv_pad]  value rows in pairs of keys
};

}  // namespace attnkit::detail
