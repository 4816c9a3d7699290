// The band of a Partial key tile (kernel/tiles/attention_tiles.hpp): for each query, the hull of
// the tile's keys it may see, from the mask's runs(). A sliding window's tiles, PowerOfTwo's window
// and the causal diagonal see a band of the tile: with 64 queries and a 64-key window, half of the
// 64 x 128 box the tile GEMMs would compute. When the hulls of groups of kLanes queries leave
// enough of the box out, the tile's two products run over the band: the logits block by block of
// gemm::kMR keys over the vectors of queries that see one of them (the other logits are -inf
// without a product, and the masking leaves them so), the weighted sum block by block of at most
// gemm::kMR queries over the keys those see (the others weigh 0). On a window of 64 that is 11%
// less work than whole groups of 16 queries over their hulls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include "attnkit/core/tensor.hpp"
#include "attnkit/detail/traits.hpp"
#include "attnkit/gemm/tile_gemm.hpp"
#include "attnkit/kernel/tiles/tile_config.hpp"
#include "attnkit/mask/faces.hpp"
#include "attnkit/mask/tile_kind.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/storage/f32_rows.hpp"

namespace attnkit::detail {

class TileBand {
 public:
  // Queries per group: one AVX-512 vector (16 lanes), two AVX2 vectors.
  static constexpr Index kLanes = simd::kWidth >= 16 ? simd::kWidth : 16;

  /// Forms the hulls of keys [k0, k0 + nk) for queries i0 .. i0 + nq - 1 (head h of batch b)
  /// and returns whether the banded products pay: the hulls of the groups cover at most kPays
  /// of the box nk x lanes. Always false for a mask without runs().
  template <class Mask>
  bool form(const Mask& mask, Index b, Index h, Index i0, Index k0, Index nk, Index nq,
            Index lanes) {
    if constexpr (!has_runs<Mask>::value) {
      (void)mask, (void)b, (void)h, (void)i0, (void)k0, (void)nk, (void)nq, (void)lanes;
      return false;
    } else {
      for (Index r = 0; r < nq; ++r) {
        Index lo = nk, hi = 0;
        for (const Range& run : mask.runs(b, h, i0 + r)) {
          const Index a = std::max<Index>(run.begin - k0, 0);
          const Index e = std::min<Index>(run.end - k0, nk);
          if (a < e) lo = std::min(lo, a), hi = std::max(hi, e);
        }
        row_hull_[static_cast<std::size_t>(r)] = lo < hi ? Range{lo, hi} : Range{0, 0};
      }
      nq_ = nq;
      vectors_ = lanes / simd::kWidth;
      for (Index v = 0; v < vectors_; ++v)
        vector_hull_[static_cast<std::size_t>(v)] =
            rows_hull(v * simd::kWidth, (v + 1) * simd::kWidth);
      Index covered = 0;
      for (Index g = 0; g * kLanes < lanes; ++g) {
        const Range hull = rows_hull(g * kLanes, (g + 1) * kLanes);
        covered += (hull.end - hull.begin) * std::min(kLanes, lanes - g * kLanes);
      }
      covered_ = covered;
      return covered * kPaysDen <= nk * lanes * kPaysNum;
    }
  }

  /// The (key, lane) pairs the last form() found in the hulls.
  Index covered() const { return covered_; }

  /// s[nk, lanes] (rows lds apart) = keys * qt [d, ldq] where a query's hull holds the key,
  /// -inf elsewhere: block by block of gemm::kMR keys, over the vectors of queries whose
  /// hulls reach it (and any between), in one GEMM of that many vectors.
  void logits(const F32Rows& keys, Index nk, Index lanes, const float* qt, Index ldq, Index d,
              float* s, Index lds) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (Index j0 = 0; j0 < nk; j0 += gemm::kMR) {
      const Index j1 = std::min(nk, j0 + Index{gemm::kMR});
      Index v0 = vectors_, v1 = 0;
      for (Index v = 0; v < vectors_; ++v) {
        const Range& hull = vector_hull_[static_cast<std::size_t>(v)];
        if (hull.begin < j1 && hull.end > j0) v0 = std::min(v0, v), v1 = v + 1;
      }
      const Index c0 = std::min(v0 * simd::kWidth, lanes),
                  c1 = std::max(c0, std::min(v1 * simd::kWidth, lanes));
      for (Index jj = j0; jj < j1; ++jj) {
        std::fill(s + jj * lds, s + jj * lds + c0, kNegInf);
        std::fill(s + jj * lds + c1, s + jj * lds + lanes, kNegInf);
      }
      if (c0 < c1)
        gemm::gemm(j1 - j0, c1 - c0, d, {keys.data + j0 * keys.ld, keys.ld, 1}, qt + c0, ldq,
                   s + j0 * lds + c0, lds, false);
    }
  }

  /// acc[nq, dv_pad] += P[nq, j0:j1] * values[j0:j1] over the band, P read transposed from s
  /// (rows lds apart): block by block of at most gemm::kMR queries (the micro-kernel's row
  /// block's own, in near-equal blocks), each over the keys its queries see.
  void weighted_sum(const float* s, Index lds, const F32Rows& values, Index j0, Index j1, Index nq,
                    float* acc, Index dv_pad) const {
    constexpr Index kMR = gemm::kMR;
    const Index blocks = (nq + kMR - 1) / kMR;
    for (Index x = 0, r0 = 0; x < blocks; ++x) {
      const Index r1 = r0 + (nq - r0) / (blocks - x);  // near-equal blocks, the last ones short
      const Range hull = rows_hull(r0, r1);
      const Index a = std::max(j0, hull.begin), e = std::min(j1, hull.end);
      if (a < e)
        gemm::gemm(r1 - r0, dv_pad, e - a, {s + a * lds + r0, 1, lds}, values.data + a * values.ld,
                   values.ld, acc + r0 * dv_pad, dv_pad, true);
      r0 = r1;
    }
  }

 private:
  // The banded products pay when the hulls cover at most 3/4 of the box (measured: a group's
  // GEMM of one vector of columns runs at ~85% of the whole tile's rate).
  static constexpr Index kPaysNum = 3, kPaysDen = 4;
  static constexpr std::size_t kRows = std::size_t{TileConfig::kBlockQ};

  // The union of the hulls of queries [r0, min(r1, nq)), {0, 0} when they see none.
  Range rows_hull(Index r0, Index r1) const {
    Index lo = std::numeric_limits<Index>::max(), hi = 0;
    for (Index r = r0; r < std::min(r1, nq_); ++r) {
      const Range& h = row_hull_[static_cast<std::size_t>(r)];
      if (h.begin < h.end) lo = std::min(lo, h.begin), hi = std::max(hi, h.end);
    }
    return lo < hi ? Range{lo, hi} : Range{0, 0};
  }

  Range row_hull_[kRows] = {};                                 // per query, the keys it sees
  Range vector_hull_[kRows / std::size_t{simd::kWidth}] = {};  // per vector of queries
  Index nq_ = 0, vectors_ = 0, covered_ = 0;
};

}  // namespace attnkit::detail
